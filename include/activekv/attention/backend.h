// Pluggable attention for the model's exact route (docs/cuda.md, "--device cuda").
//
// An AttentionBackend computes one layer's attention for a block of query rows
// over that layer's exact history, with the contract of attention::attend
// (paged_attention.h): causal (a row at position p sees keys [0, p]), GQA
// (query head h uses KV head h / group), scores (q . k) * softmax_scale
// (0 = 1/sqrt(head_dim)), result a Partial [n_rows][n_heads][head_dim] with
// normalised O and natural-log LSE. It may differ from attend() by fp32
// rounding only. When set in model::ForwardOptions, LlamaModel::layer_forward
// calls it instead of route::attend_routed for views with no compressed
// history; compressed routes always run on the CPU.
//
// The layer's K/V for the query rows are in the host pages (written by the
// model) before the call. Implementations are not required to be thread-safe.
#pragma once

#include "activekv/attention/paged_attention.h"
#include "activekv/attention/partial.h"

namespace activekv::attention {

class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;
  /// Attention of `q` over `history` of layer `layer` (same contract as
  /// attend(history, q, opt, ...); opt.tile_pages may be ignored).
  virtual Partial attend(int layer, const LayerHistory& history, const QueryRows& q,
                         const AttentionOptions& opt) = 0;
};

}  // namespace activekv::attention
