// The int8s query codes on the GPU (SPEC §3.3; the CPU twin is
// include/activekv/attention/int8s_query.h): shared by the legacy int8s
// kernel (int8s_attention.cu) and the tensor-core one (int8s_tc_attention.cu),
// so both quantise the channel-scaled query with the CPU reference's arithmetic.
// Internal header (src/cuda only).
#pragma once

#include <cstdint>

namespace activekv::cuda::detail {

// Code of x on the grid `step`: round half to even, clipped to +-127; step 0 gives 0.
__device__ __forceinline__ int8_t quantise_int8(float x, float step) {
  return step == 0.f ? int8_t(0) : int8_t(fminf(fmaxf(rintf(x / step), -127.f), 127.f));
}

// The second term's code of x (the rounding residual of code `hi` on the grid
// a, on the grid a / 127): rounded product, then rounded difference (no FMA
// contraction), the CPU reference's arithmetic.
__device__ __forceinline__ int8_t quantise_int8_residual(float x, float a, int8_t hi) {
  return quantise_int8(__fsub_rn(x, __fmul_rn(a, float(hi))), a / 127.f);
}

}  // namespace activekv::cuda::detail
