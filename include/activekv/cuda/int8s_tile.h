// The GPU int8s kernel behind the CPU tile contract: runs
// launch_split_attention_int8s + launch_merge over a tile of int8s pages for
// causal query rows, with the contract of attention::attend_int8s_tile
// (activekv/attention/attention_codecs.h). Used by `eval --int8s-kernel cuda` to
// measure the GPU kernel's own-format error on the real-model samples, and by
// the GPU tests to compare it with the CPU kernel.
//
// Blobs are validated on the host first (kv::parse_int8s_page: header,
// checksum, scales, codes), or come as views validated at publication, then
// are uploaded. Each query row is one sequence of
// the kernel's work list, limited to the keys its position may see, so a row
// re-reads the tile (fine for samples; the decode engine is the fast path).
// Synchronous: returns when the Partial is on the host.
#pragma once

#include <cstdint>
#include <span>

#include "activekv/attention/paged_attention.h"
#include "activekv/attention/partial.h"
#include "activekv/cuda/format_kernels.h"
#include "activekv/kv/codec.h"
#include "activekv/kv/codec_int8s.h"

namespace activekv::cuda {

class Int8sTileRunner {
 public:
  /// `kernel.query_terms` is overridden per call by opt.int8s_query_terms.
  explicit Int8sTileRunner(Int8sKernelOptions kernel = {}) : kernel_(kernel) {}

  /// Same arguments and result as attention::attend_int8s_tile, and its
  /// errors, within the GPU kernel's limits, each an InvalidArgument naming
  /// the value: head_dim 64 or 256, at most 8 query heads per KV head (the
  /// tc kernel: 3, 4, 6, 7 or 8), a page
  /// size that is a multiple of 16, softmax_scale >= 0, and only full pages
  /// (the CPU kernel also reads a partly written last page; the engine keeps
  /// such a page exact). CudaError from the GPU.
  attention::Partial operator()(std::span<const kv::EncodedPage* const> pages, int64_t first_token,
                                int64_t history_tokens, const attention::QueryRows& q,
                                const attention::AttentionOptions& opt) const;
  /// Same over pages validated at publication (route::Int8sTileFn): no
  /// validation again, the blobs are uploaded as they are.
  attention::Partial operator()(std::span<const kv::Int8sPageView> pages, int64_t first_token,
                                int64_t history_tokens, const attention::QueryRows& q,
                                const attention::AttentionOptions& opt) const;

 private:
  Int8sKernelOptions kernel_;
};

}  // namespace activekv::cuda
