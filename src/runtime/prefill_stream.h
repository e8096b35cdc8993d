// Internal to the GPU runtime: the staging of a streamed prefill (see
// activekv/route/prefill_plan.h). When a prompt's history does not fit the
// GPU budget, each chunk's attention reads every layer's earlier pages from
// the pinned host store through two device staging buffers of
// `staging_pages` pages: buffer i % 2 receives item i (layer l, segment s:
// items run l-major) on a copy stream while the compute stream attends item
// i - 1. Events order the two streams (copied[b]: item in buffer b landed;
// consumed[b]: the attention that read it is done); no host synchronisation
// inside a chunk.
//
// A layer whose earlier pages fit one buffer is attended by the resident call
// over a page table pointing at the staged copies (HistoryView sets it): the
// same kernel, geometry and bytes, so the same bits. A longer history is
// attended segment by segment with PrefillAttention::run_keys, then the
// chunk's own pages causally, and the (O, LSE) partials are merged
// pairwise in ascending key order with launch_merge (SPEC §4).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "activekv/cuda/prefill.h"
#include "device_buffer.h"

namespace activekv::runtime {

class PrefillStream {
 public:
  /// Host address of page `page` of `layer` (pinned).
  using HostPage = std::function<const std::byte*(int layer, size_t page)>;

  /// Two staging buffers of `staging_pages` (>= 1) pages of `attn`'s shape,
  /// and merge buffers for up to `max_rows` rows. Throws CudaError naming
  /// what did not fit.
  PrefillStream(const cuda::AttnShape& attn, int n_layers, int64_t staging_pages, int max_rows);
  ~PrefillStream();
  PrefillStream(const PrefillStream&) = delete;
  PrefillStream& operator=(const PrefillStream&) = delete;

  /// Device address of staging slot `j` of buffer `b` (0 or 1).
  const void* slot(int b, int64_t j) const;
  /// True when `history_pages` pages of a layer fit one buffer.
  bool whole_layer(int64_t history_pages) const { return history_pages <= staging_pages_; }
  /// The buffer layer `l`'s history uses in a whole-layer chunk.
  static int layer_buffer(int l) { return l % 2; }

  /// Starts a chunk whose layers read pages [0, history_pages) from the
  /// host: the copy stream waits for `s` to get here, then the first two
  /// items are copied.
  void begin_chunk(int64_t history_pages, HostPage host_page, cudaStream_t s);
  /// Layer l's attention of `rows` rows at pos0 (pos0 / page_size >=
  /// history_pages of begin_chunk), enqueued on `s`: layer_table is the
  /// layer's device page table (n_pages pages cover pos0 + rows tokens; in a
  /// whole-layer chunk its first history_pages entries are this buffer's
  /// slots; from page history_pages on, the chunk's device pages).
  void attend(int l, const void* const* layer_table, int64_t n_pages, int64_t pos0, int rows, const float* q,
              float* out, cuda::PrefillAttention& pa, cudaStream_t s);
  /// Waits for the copy stream (before the staging is freed or reused elsewhere).
  void synchronize();

  /// Host -> device bytes copied so far.
  size_t bytes_moved() const { return moved_; }
  /// Device bytes owned (staging and merge buffers).
  size_t device_bytes() const { return device_bytes_; }

 private:
  void copy_item(int64_t i);
  void wait_copied(int64_t i, cudaStream_t s);
  void consumed(int64_t i, cudaStream_t s);
  void to_slot(int slot, int rows, cudaStream_t s);
  void merge(int rows, float* out, cudaStream_t s);
  int64_t segments() const;

  cuda::AttnShape attn_;
  int n_layers_;
  int64_t staging_pages_;
  int max_rows_;
  size_t page_bytes_;
  std::unique_ptr<cuda::DevBuf> staging_;   // [2][staging_pages] pages
  std::unique_ptr<cuda::DevBuf> slots_;     // device [2][staging_pages] slot addresses (segment tables)
  std::unique_ptr<cuda::DevBuf> part_o_;    // [max_rows][2][n_q_heads][head_dim]: accumulator, new segment
  std::unique_ptr<cuda::DevBuf> part_lse_;  // [max_rows][2][n_q_heads]
  std::unique_ptr<cuda::DevBuf> seg_o_;     // [max_rows][n_q_heads][head_dim]: a segment's (or a merge's) result
  std::unique_ptr<cuda::DevBuf> seg_lse_;   // [max_rows][n_q_heads]
  std::unique_ptr<cuda::DevBuf> twos_;      // int32 [max_rows] = 2: the merge's partial counts
  cudaStream_t copy_ = nullptr;
  cudaEvent_t start_ = nullptr, copied_[2] = {nullptr, nullptr}, consumed_[2] = {nullptr, nullptr};
  // The current chunk.
  int64_t history_pages_ = 0;
  HostPage host_page_;
  size_t moved_ = 0;
  size_t device_bytes_ = 0;
};

}  // namespace activekv::runtime
