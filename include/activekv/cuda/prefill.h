// Chunked prefill attention on the GPU: a chunk of query rows attends,
// causally, to a paged BF16 history already in GPU memory (the pages hold the
// history before the chunk AND the chunk's own K/V, written before the call).
//
// Row r of the chunk sits at absolute position pos0 + r and attends tokens
// [0, pos0 + r]. It runs the decode split kernel and the SPEC §4 merge of
// decode_attention.h with every query row as one "sequence" of the batch, so a
// row's output is bitwise what a decode step at that position would produce
// with the same split size.
//
// Cost: each row re-reads its history (served from L2 for short histories);
// a tiled multi-row kernel that reads each K/V block once per chunk is future
// work (see docs/cuda.md).
#pragma once

#include <cstdint>
#include <vector>

#include "activekv/cuda/decode_attention.h"

namespace activekv::cuda {

/// Work list of a prefill chunk (host side; exposed for tests and planning).
struct PrefillPlan {
  std::vector<SplitWork> work;
  std::vector<int32_t> n_splits;  ///< per row
  int max_splits = 0;
};

/// Builds the work of rows [0, n_rows) at positions pos0 + r over `pages`
/// (device pointers, token order; pages.size() * page_size must cover
/// pos0 + n_rows tokens). Throws InvalidArgument otherwise.
PrefillPlan plan_prefill(const AttnShape& shape, const std::vector<const void*>& pages, int64_t pos0,
                         int n_rows);

class PrefillAttention {
 public:
  explicit PrefillAttention(const AttnShape& shape);
  ~PrefillAttention();
  PrefillAttention(const PrefillAttention&) = delete;
  PrefillAttention& operator=(const PrefillAttention&) = delete;

  /// q: device fp32 [n_rows][n_q_heads][head_dim]; out: same shape; out_lse:
  /// device fp32 [n_rows][n_q_heads] or null. Uploads the work list (waits for
  /// `stream` first: call it between steps), then enqueues the split kernel and
  /// the merge on `stream`.
  void run(const std::vector<const void*>& pages, int64_t pos0, int n_rows, const float* q, float* out,
           float* out_lse, cudaStream_t stream);

 private:
  void reserve(size_t n_work, size_t n_rows, int max_splits);
  AttnShape sh_;
  SplitWork* work_dev_ = nullptr;
  int32_t* n_splits_dev_ = nullptr;
  float* part_o_ = nullptr;
  float* part_lse_ = nullptr;
  size_t cap_work_ = 0, cap_rows_ = 0;
  int cap_splits_ = 0;
};

}  // namespace activekv::cuda
