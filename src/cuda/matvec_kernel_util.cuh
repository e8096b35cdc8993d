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

/// Work item i's matrix in a grouped launch: its weights, output, rows and
/// the item's index within it (the first matrix whose cta_end exceeds i, or
/// the last). The items are CTAs (group_part) or, for the persistent
/// tensor-core kernel, 16-row tiles (mma_matvec.cu).
struct GroupPart {
  const uint8_t* w;
  float* y;
  int64_t rows;
  int64_t cta;
};

/// Every index into g is a constant of the unrolled loop: an index computed
/// at run time (g.w[i]) made the compiler copy the whole argument block to
/// local memory in every thread (120 bytes a thread in the PTX: 120 x 128
/// threads x the QKV group's 1024 CTAs = ~15.7 MB of local stores, by count).
__device__ __forceinline__ GroupPart group_part_at(const GroupArgs& g, uint32_t i) {
  GroupPart p{g.w[0], g.y[0], g.rows[0], int64_t(i)};
#pragma unroll
  for (int k = 1; k < kMaxMatvecGroup; ++k) {
    if (k < g.n && i >= g.cta_end[k - 1]) {  // past matrix k - 1's items: matrix k or a later one
      p = GroupPart{g.w[k], g.y[k], g.rows[k], int64_t(i) - int64_t(g.cta_end[k - 1])};
    }
  }
  return p;
}

/// This CTA's matrix in a grouped launch (item blockIdx.x).
__device__ __forceinline__ GroupPart group_part(const GroupArgs& g) { return group_part_at(g, blockIdx.x); }

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
