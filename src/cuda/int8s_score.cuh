// The score of one token and query head from the int8s kernels' integer dot
// products (SPEC §3.3): s = ((hi + lo / 127) * token_scale) * row_scale, with
// hi and lo the exact int32 dot products of the query's two code terms with
// the token's key codes. Shared by the legacy kernel (int8s_attention.cu) and
// the tensor-core one (int8s_tc_attention.cu); the CPU kernels
// (src/cpu/kernels_*.cpp) compute the same expression with a division.
//
// lo / 127 without a division: an IEEE division is a subroutine of about ten
// instructions with a slow-path branch, on the critical path of every block's
// softmax. For an integer |lo| <= 2^24 (|lo| <= 512 * 127 * 127 at the
// largest head_dim), q = lo * RN(1/127) is within an ulp of the quotient and
// one fma-corrected step, q + RN(lo - 127 q) * RN(1/127), is the correctly
// rounded quotient (Markstein's correction); tests/cuda/test_int8s_score_host.cpp
// checks every integer in [-2^24, 2^24] against lo / 127.f, bit for bit, on
// the CPU. Internal header (src/cuda only), compiled for host and device.
#pragma once

#ifdef __CUDACC__
#define AKV_SCORE_HD __host__ __device__ __forceinline__
#else
#define AKV_SCORE_HD inline
#endif
#include <cmath>

namespace activekv::cuda::detail {

/// x / 127 rounded to nearest even, for x an integer with |x| <= 2^24 (exact in fp32).
AKV_SCORE_HD float div127_rn(float x) {
  constexpr float kInv127 = 1.f / 127.f;  // RN(1/127)
#ifdef __CUDA_ARCH__
  const float q = __fmul_rn(x, kInv127);  // _rn: never contracted into the fma below
  return __fmaf_rn(__fmaf_rn(-q, 127.f, x), kInv127, q);
#else
  const float q = x * kInv127;
  return std::fma(std::fma(-q, 127.f, x), kInv127, q);
#endif
}

/// Base-2 score of one token: dot_hi, dot_lo the int32 dot products of the
/// query's first and second code terms with the token's key codes,
/// token_scale the key's token scale, row_scale a_g * softmax scale * log2 e.
AKV_SCORE_HD float int8s_score(int dot_hi, int dot_lo, float token_scale, float row_scale) {
  return ((float(dot_hi) + div127_rn(float(dot_lo))) * token_scale) * row_scale;
}

}  // namespace activekv::cuda::detail
