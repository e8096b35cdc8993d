// Internal to the CUDA backend: the tail of the split attention kernel
// (decode_attention.cu), where a CTA's W warp states for one query head --
// running max m_i (base 2), row sum l_i, unnormalised O_i -- merge into the
// split's partial (O, LSE).
//
// The merge weights depend on the head only: sc_i = 2^(m_i - M) with M the
// largest m_i, L = sum_i sc_i * l_i. HeadMerge computes them once per head
// (one thread each); every output channel then takes only its W products.
// Before, each of the group x head_dim outputs recomputed M, the W exp2 and
// L itself: at depth 0 the tail is on the step's critical path (4 CTAs).
// The arithmetic and its order are those of the per-output form, so the
// partials keep their bits (tests/cuda/test_split_tail_host.cpp compares
// them with that form on the CPU, warps with no tokens and underflowing
// weights included).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define AKV_TAIL_HD __host__ __device__ __forceinline__
#else
#define AKV_TAIL_HD inline
#include <cmath>
#endif

namespace activekv::cuda::split_tail {

/// One query head's merge of W warp states.
template <int W>
struct HeadMerge {
  float M;         // max_i m_i (-inf when no warp saw a token)
  float L;         // sum over warps with tokens, in warp order, of sc_i * l_i
  uint32_t valid;  // bit i: warp i saw a token (m_i != -inf)
  float sc[W];     // 2^(m_i - M) for the valid warps
};

/// m[i * stride], l[i * stride]: warp i's max and row sum for this head.
template <int W>
AKV_TAIL_HD HeadMerge<W> head_merge(const float* m, const float* l, int stride) {
  HeadMerge<W> hm;
  hm.M = -INFINITY;
  for (int i = 0; i < W; ++i) hm.M = fmaxf(hm.M, m[i * stride]);
  hm.L = 0.f;
  hm.valid = 0;
  for (int i = 0; i < W; ++i) {
    const float mi = m[i * stride];
    hm.sc[i] = 0.f;
    if (hm.M == -INFINITY || mi == -INFINITY) continue;
    hm.sc[i] = exp2f(mi - hm.M);
    hm.valid |= 1u << i;
    hm.L = fmaf(hm.sc[i], l[i * stride], hm.L);
  }
  return hm;
}

/// Output channel: acc[i * stride] is warp i's unnormalised O at it.
template <int W>
AKV_TAIL_HD float merged_output(const HeadMerge<W>& hm, const float* acc, int stride) {
  if (hm.valid == 0) return 0.f;
  float O = 0.f;
  for (int i = 0; i < W; ++i)
    if (hm.valid >> i & 1u) O = fmaf(hm.sc[i], acc[i * stride], O);
  return O / hm.L;
}

/// The partial's LSE (natural log) for this head; ln2 = ln(2) as the kernel's.
template <int W>
AKV_TAIL_HD float merged_lse(const HeadMerge<W>& hm, float ln2) {
  return hm.M == -INFINITY ? -INFINITY : (hm.M + log2f(hm.L)) * ln2;
}

}  // namespace activekv::cuda::split_tail
