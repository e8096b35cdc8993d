// The flash-style prefill attention kernel's launch interface and geometry
// (internal: src/cuda only). The contract and the host-side class are in
// include/activekv/cuda/prefill.h; the kernel is in prefill_attention.cu.
#pragma once

#include <cstddef>
#include <cstdint>

typedef struct CUstream_st* cudaStream_t;

#if defined(__CUDACC__)
#define AKV_HOST_DEVICE __host__ __device__
#else
#define AKV_HOST_DEVICE
#endif

namespace activekv::cuda::prefill_detail {

/// Keys per pipeline block (the unit of cp.async staging, masking and split boundaries).
inline constexpr int kKeyBlock = 32;
/// Dynamic shared memory one CTA may use on sm_90 (227 KiB).
inline constexpr size_t kMaxSmem = size_t(227) * 1024;

// Shared memory: `stages` K/V blocks (K rows then V rows, bf16, HD channels)
// followed by each warp's query fragments (HD/16 k-steps x terms x 32 lanes x 16 B).
AKV_HOST_DEVICE constexpr size_t stage_bytes(int hd) { return size_t(2) * kKeyBlock * hd * 2; }
AKV_HOST_DEVICE constexpr size_t q_frag_bytes(int hd, int terms, int warps) {
  return size_t(warps) * size_t(hd) * size_t(terms) * 32;
}
/// Warps per CTA (16 query (row, head) pairs each): 8 when their query
/// fragments and two K/V stages fit, else 4 (head_dim 256 with 3 terms).
AKV_HOST_DEVICE constexpr int warps(int hd, int terms) {
  return q_frag_bytes(hd, terms, 8) + 2 * stage_bytes(hd) <= kMaxSmem ? 8 : 4;
}
/// cp.async ring depth: 3 (two blocks in flight while one is computed) when it fits, else 2.
AKV_HOST_DEVICE constexpr int stages(int hd, int terms) {
  return q_frag_bytes(hd, terms, warps(hd, terms)) + 3 * stage_bytes(hd) <= kMaxSmem ? 3 : 2;
}
AKV_HOST_DEVICE constexpr size_t smem_bytes(int hd, int terms) {
  return size_t(stages(hd, terms)) * stage_bytes(hd) + q_frag_bytes(hd, terms, warps(hd, terms));
}
/// Query rows per CTA: the CTA's 16 * warps mma rows hold (row, head) pairs
/// row-major, so floor(16 * warps / group) whole rows.
AKV_HOST_DEVICE constexpr int block_rows(int hd, int terms, int group) { return 16 * warps(hd, terms) / group; }

/// Everything the kernel reads; positions are absolute token indices (< 2^31).
struct KernelArgs {
  const void* const* pages = nullptr;  ///< device array of device page pointers, token order
  int page_size = 0, n_kv = 0, group = 0;
  /// The pages' heads: the CTAs of KV head h read page head head0 + h of
  /// page_heads (a head shard, AttnShape::kv_head0; else 0 and n_kv).
  int head0 = 0, page_heads = 0;
  int pos0 = 0, n_rows = 0;
  /// Keys at or past key_end are never read nor attended (a segment of the
  /// history: PrefillAttention::run_keys); the default leaves only the causal limit.
  int key_end = 0x7fffffff;
  /// Sliding window (0: none): row p attends only keys in (p - window, p];
  /// blocks wholly before a CTA's window are not read.
  int window = 0;
  const float* q = nullptr;  ///< [n_rows][n_kv * group][head_dim]
  float scale_log2 = 0.f;    ///< softmax_scale * log2(e)
  // n_splits == 1: the result goes to out / out_lse (may be null).
  float* out = nullptr;
  float* out_lse = nullptr;
  // n_splits > 1: CTA z handles keys [z * split_keys, (z + 1) * split_keys) and
  // writes partials [row][split][n_q_heads][(head_dim) | 1]; split-0 CTAs of KV
  // head 0 write row_splits[row] = n_splits for the merge.
  int n_splits = 1, split_keys = 0;
  float* part_o = nullptr;
  float* part_lse = nullptr;
  int32_t* row_splits = nullptr;
};

/// Sets the kernel's shared-memory limit on the current device and returns how
/// many CTAs of it fit on one SM. Throws CudaError / InvalidArgument.
int configure_kernel(int head_dim, int terms);
/// Enqueues the kernel: grid (ceil(n_rows / block_rows), n_kv, n_splits).
void launch_kernel(const KernelArgs& a, int head_dim, int terms, cudaStream_t stream);

}  // namespace activekv::cuda::prefill_detail
