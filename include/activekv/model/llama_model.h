// Llama-family forward pass on the CPU, with the KV history in host pages.
//
// Per layer: x += Wo · attn(RoPE(Wq·n), RoPE(Wk·n), Wv·n) with n = RMSNorm(x);
// then x += W_down · (silu(W_gate·m) * (W_up·m)) with m = RMSNorm(x).
// gemma3 (ModelConfig flags; docs/gemma3.md): embeddings × sqrt(d_model),
// per-head RMSNorm on q and k before RoPE, each layer's own RoPE base and
// sliding window (attention reads only the pages inside it), RMSNorm on the
// attention and FFN outputs before each residual add, GeGLU (tanh GELU).
// Attention reads the history only through the sequence's page tables
// (attention::attend: per-tile partials merged by LSE). All compute is fp32;
// GEMMs go through OpenBLAS, elementwise work through OpenMP.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "activekv/attention/paged_attention.h"
#include "activekv/gguf/gguf.h"
#include "activekv/kv/page_store.h"
#include "activekv/model/config.h"
#include "activekv/model/weights.h"
#include "activekv/route/routed_attention.h"

namespace activekv::model {

/// Sees each layer's query rows after RoPE: q [T][n_heads][head_dim] at
/// positions pos[T]. For evaluation tools (collecting real attention samples).
using QueryObserver = std::function<void(int layer, int T, const float* q, const int64_t* pos)>;

/// Where a forward pass's activations are observed, in the order they occur.
/// The GPU forward (activekv/runtime/gpu_forward.h) reports the same stages,
/// so a test can name the first layer and stage where the two part.
enum class Stage {
  embedding,     ///< layer -1: the scaled embedding rows x [T][d_model]
  queries,       ///< q [T][n_heads*head_dim] after the projection, QK-norm and RoPE
  attention,     ///< the attention output [T][n_heads*head_dim], before Wo
  layer_output,  ///< the residual stream x [T][d_model] after the layer
};
/// "embedding", "queries", "attention", "layer output".
const char* stage_name(Stage s);
/// Sees T rows of `width` floats (host memory, valid during the call) of
/// `layer` at `stage`. For tests.
using StageObserver = std::function<void(int layer, Stage stage, int T, int width, const float* rows)>;

/// ForwardOptions::cpu_attention_kernels' default: true unless
/// ACTIVEKV_CPU_ATTENTION is "reference" (A/B runs). Throws InvalidArgument
/// naming any value but "", "auto" and "reference".
bool cpu_attention_kernels_default();

struct ForwardOptions {
  int prefill_chunk = 256;  ///< tokens per forward call during prefill
  attention::AttentionOptions attention;
  QueryObserver on_queries;  ///< optional
  StageObserver on_stage;    ///< optional
  /// Decode and prefill rows over exact bf16 pages by the in-place CPU
  /// kernels (route::RoutedView::cpu_attention_kernels); false:
  /// attention::attend_tile.
  bool cpu_attention_kernels = cpu_attention_kernels_default();
};

/// The attention options layer `layer` of a model with config `c` runs
/// with: `base`, the layer's sliding window (ModelConfig::layer_attention)
/// and, unless base sets one, the model's query scale. LlamaModel and the
/// GPU eval (own-format samples without a CPU model) both use it.
attention::AttentionOptions layer_attention_options(const ModelConfig& c, int layer,
                                                    attention::AttentionOptions base = {});

/// Called after each prefill chunk with (tokens done, tokens total).
using ProgressFn = std::function<void(int64_t done, int64_t total)>;

/// One sequence's share of a batched forward pass (LlamaModel::forward_batch):
/// `tokens` are appended at positions seq->n_tokens() .. + n-1 of `seq`,
/// whose history is read along `view` (nullptr: exact).
struct BatchItem {
  std::span<const int32_t> tokens;
  kv::SequenceKv* seq = nullptr;
  const route::RoutedView* view = nullptr;
};

class LlamaModel {
 public:
  /// Reads config and weights from an opened GGUF file (the file may be
  /// closed afterwards: weights are copied). Throws Error on unsupported or
  /// malformed models.
  explicit LlamaModel(const gguf::File& f, ForwardOptions opt = {});

  const ModelConfig& config() const { return config_; }
  const ForwardOptions& options() const { return opt_; }
  /// Replaces the forward options (chunking, tiling). Throws InvalidArgument
  /// for a non-positive prefill_chunk or tile_pages.
  void set_options(const ForwardOptions& opt);
  /// The attention options layer `layer` runs with: options().attention,
  /// its sliding window (ModelConfig::layer_attention) and, unless set, the
  /// model's query scale. `activekv eval` measures with the same options.
  attention::AttentionOptions attention_options(int layer) const;
  /// The KV shape a PageStore for this model must have, for a given page
  /// size (tokens) and page format.
  kv::KvShape kv_shape(int page_size, kv::PageFormat format = kv::PageFormat::bf16) const;

  /// Runs `tokens` at positions seq.n_tokens() .. + n-1, appending their K/V
  /// to `seq`. Writes logits [n][vocab] if all_logits, else only the last
  /// row's [vocab]; `logits` must be at least that large.
  /// Throws InvalidArgument on a bad token id or a short logits buffer;
  /// the sequence is unchanged on such errors. `view` chooses the route the
  /// history is read along (nullptr: exact, tiles of options().attention.tile_pages).
  void forward(std::span<const int32_t> tokens, kv::SequenceKv& seq, std::span<float> logits,
               bool all_logits = false, const route::RoutedView* view = nullptr);

  /// Runs several sequences in one pass (a server's decode step): the
  /// projections and the FFN over all their rows together, each weight
  /// matrix read once for the whole batch (Matrix::project: up to 16 rows of
  /// a block matrix bitwise the single-sequence result; fp32 matrices and
  /// more rows through sgemm, which may round otherwise), attention per
  /// sequence over its own page tables only. Writes each item's last-row logits to logits[i][vocab].
  /// Throws InvalidArgument for no items, an item without tokens or
  /// sequence, the same sequence twice, a bad token id or a short logits
  /// buffer, and Error if a sequence's store is full; every sequence is
  /// unchanged on those errors.
  void forward_batch(std::span<const BatchItem> items, std::span<float> logits);

  /// Runs a long prompt in chunks of options().prefill_chunk, returning the
  /// last token's logits [vocab]. `progress` (may be empty) is called per
  /// chunk; `view` as in forward(); if it has a compressed history, pages
  /// that fill up are scheduled for conversion after each chunk.
  std::vector<float> prefill(std::span<const int32_t> tokens, kv::SequenceKv& seq,
                             const ProgressFn& progress = {}, const route::RoutedView* view = nullptr);

 private:
  // Checks `items` and sizes the activations for their rows; returns the row count.
  int prepare_rows(std::span<const BatchItem> items, size_t logits_size, bool all_logits);
  void run_rows(std::span<const BatchItem> items, int T);
  void layer_forward(int l, int T, std::span<const BatchItem> items);

  ModelConfig config_;
  Weights w_;
  QuantScratch scratch_;  // the block matrices' prefill path
  ForwardOptions opt_;
  // Activations, reused across calls: x [T][d], norm [T][d], q [T][nh*hd],
  // k,v [T][nkv*hd], gate/up [T][ffn], tmp [T][d].
  // attn [T][nh*hd]: the attention outputs of a batch's sequences side by side.
  std::vector<float> x_, norm_, q_, k_, v_, gate_, up_, tmp_, attn_;
  std::vector<int64_t> pos_;
  std::vector<int> row0_;  // first row of each batch item
  attention::Workspace ws_;
};

}  // namespace activekv::model
