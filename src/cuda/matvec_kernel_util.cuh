// Internal to the CUDA backend: pieces every matvec kernel shares
// (quant_matvec.cu, register_matvec.cu): a row's warp reduction and store, the
// arguments of a grouped launch, and the compile-time dispatch of the
// vector count and the rows per warp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "activekv/core/error.h"
#include "activekv/cuda/quant_matvec.h"
#include "matvec_host.h"

namespace activekv::cuda::mvkern {

/// Sums each acc[v] over the warp (xor butterfly: the same order in every
/// kernel, so that equal lane partials give equal rows) and lane 0 stores
/// y[v][row], adding to it when `accumulate`.
template <int NV>
__device__ __forceinline__ void write_row(float* acc, float* y, int64_t rows, int64_t row, bool accumulate) {
#pragma unroll
  for (int v = 0; v < NV; ++v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[v] += __shfl_xor_sync(0xffffffffu, acc[v], o);
  }
  if ((threadIdx.x & 31) == 0) {
#pragma unroll
    for (int v = 0; v < NV; ++v) {
      float* p = y + v * rows + row;
      *p = accumulate ? *p + acc[v] : acc[v];
    }
  }
}

/// The matrices of a grouped launch (mvhost::GroupPlan's layout): matrix i
/// owns CTAs [cta_end[i-1], cta_end[i]).
struct GroupArgs {
  const uint8_t* w[kMaxMatvecGroup];
  float* y[kMaxMatvecGroup];
  int64_t rows[kMaxMatvecGroup];
  uint32_t cta_end[kMaxMatvecGroup];
  int n;
};

/// This CTA's matrix and its CTA index within that matrix.
__device__ __forceinline__ int group_part(const GroupArgs& g, int64_t& cta) {
  int i = 0;
  while (i < g.n - 1 && blockIdx.x >= g.cta_end[i]) ++i;
  cta = int64_t(blockIdx.x) - (i > 0 ? int64_t(g.cta_end[i - 1]) : 0);
  return i;
}

/// Calls f(std::integral_constant<int, n>) for n in 1..kMaxMatvecVectors.
template <class F>
void with_nv(int n, F&& f) {
  switch (n) {
    case 1: f(std::integral_constant<int, 1>{}); return;
    case 2: f(std::integral_constant<int, 2>{}); return;
    case 3: f(std::integral_constant<int, 3>{}); return;
    case 4: f(std::integral_constant<int, 4>{}); return;
    case 5: f(std::integral_constant<int, 5>{}); return;
    case 6: f(std::integral_constant<int, 6>{}); return;
    case 7: f(std::integral_constant<int, 7>{}); return;
    case 8: f(std::integral_constant<int, 8>{}); return;
  }
  throw InvalidArgument("matvec: n_vec " + std::to_string(n) + " is outside 1.." +
                        std::to_string(kMaxMatvecVectors));
}

/// Calls f(std::integral_constant<int, R>) for rows per warp R: 1, 2, or
/// 4 (built only for mvhost::kRowsFourVectors vectors; else 2).
template <int NV, class F>
void with_rows(int r, F&& f) {
  if constexpr (NV == mvhost::kRowsFourVectors) {
    if (r == 4) return f(std::integral_constant<int, 4>{});
  }
  if (r >= 2) return f(std::integral_constant<int, 2>{});
  f(std::integral_constant<int, 1>{});
}

}  // namespace activekv::cuda::mvkern
