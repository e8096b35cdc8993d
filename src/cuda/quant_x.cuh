// Internal to the CUDA backend: the matvec workspace's int8 activations
// (quant_matvec.h's "q8_1" quantisation) -- its layout and the device code
// that quantises one 32-element block -- shared by launch_quantize_activations
// and the kernels that quantise their own output on the way out
// (launch_rms_norm_quantize, launch_merge), so that both write the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "quant_dot.cuh"  // XQuant

namespace activekv::cuda::qx {

inline size_t align256(size_t n) { return (n + 255) & ~size_t(255); }

/// Workspace: int8 qx [n_vec][cols], then (256-byte aligned) float2 ds
/// [n_vec][cols/32] = {d, sum of q} per 32-element block of x.
inline qdot::XQuant xquant_of(const void* ws, int64_t cols, int n_vec) {
  const auto* base = static_cast<const uint8_t*>(ws);
  return {reinterpret_cast<const int8_t*>(base),
          reinterpret_cast<const float2*>(base + align256(size_t(n_vec) * cols))};
}

#ifdef __CUDACC__
/// A group of 32/K consecutive lanes (all active; `mask` names them) holds one
/// 32-element block of x, K consecutive elements a lane (lane g of the group:
/// elements K*g ..). Writes its codes to qx[K*g ..] and, from lane 0 of the
/// group, {d, sum q} to *ds: amax = max |x_i|, q_i = round_half_even(x_i *
/// (127 / amax)) (0 when amax == 0), d = amax / 127 -- every step exact or
/// correctly rounded and independent of the order of the reductions.
template <int K>
__device__ __forceinline__ void quantize_block(const float (&v)[K], unsigned mask, int g, int8_t* qx, float2* ds) {
  static_assert(K == 1 || K == 4, "a lane holds 1 or 4 elements");
  float amax = fabsf(v[0]);
#pragma unroll
  for (int k = 1; k < K; ++k) amax = fmaxf(amax, fabsf(v[k]));
#pragma unroll
  for (int o = 16 / K; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(mask, amax, o));
  const float id = amax == 0.f ? 0.f : __fdiv_rn(127.f, amax);
  int q[K], sum = 0;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    q[k] = __float2int_rn(__fmul_rn(v[k], id));
    sum += q[k];
  }
#pragma unroll
  for (int o = 16 / K; o > 0; o >>= 1) sum += __shfl_xor_sync(mask, sum, o);
  if constexpr (K == 1) {
    qx[g] = int8_t(q[0]);
  } else {
    reinterpret_cast<uint32_t*>(qx)[g] = (uint32_t(q[0]) & 0xffu) | ((uint32_t(q[1]) & 0xffu) << 8) |
                                         ((uint32_t(q[2]) & 0xffu) << 16) | (uint32_t(q[3]) << 24);
  }
  if (g == 0) *ds = make_float2(__fdiv_rn(amax, 127.f), float(sum));
}
#endif

}  // namespace activekv::cuda::qx
