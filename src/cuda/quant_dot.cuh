// Internal to the CUDA backend: the per-lane work of the block-type matvec
// (quant_matvec.cu) -- the chunk tiling, the int8 activation layout and the
// dot of one work item -- as __host__ __device__ code, so that the CPU test
// (tests/cuda/test_weights_host.cpp) runs exactly what each lane runs.
#pragma once

#include <cstdint>
#include <cmath>
#include <type_traits>

#include "quant_blocks.cuh"

namespace activekv::cuda::qdot {

using namespace qblk;

/// Matvec workspace: int8 qx [n_vec][cols], then (256-byte aligned) float2 ds
/// [n_vec][cols/32] = {d, sum of q} per 32-element block of x.
struct XQuant {
  const int8_t* qx;
  const float2* ds;
};

/// Chunks of whole blocks streamed through shared memory by one warp: 64 work
/// items each (two per lane). An item is a 32-element unit, except for
/// Q6_K, whose item (half h, 8-byte column group j) reads each ql/qh byte once
/// for the four units 4h..4h+3 that share it.
template <class T>
struct Tiling {
  static constexpr int kItemsPerChunk = 64;
  static constexpr int kItemsPerBlock = std::is_same_v<T, Q6_K> ? 8 : T::kUnits;
  static constexpr int kChunkBlocks = kItemsPerChunk / kItemsPerBlock;
  static constexpr int kChunkBytes = kChunkBlocks * T::kBytes;
  /// 16-byte granules covering a chunk that starts anywhere in its first granule.
  static constexpr int kStageBytes = (kChunkBytes + 30) / 16 * 16;
};

/// Dot of unit u of block b with x block xb, added to acc[v] for every vector:
/// acc += d_x * (A * sum(code * q) + B * sum(q)).
template <class T, int NV>
AKV_QHD void dot_unit(const uint8_t* b, int u, int64_t xb, XQuant xq, int64_t cols, float* acc) {
  uint32_t c[8];
  AKV_UNROLL
  for (int g = 0; g < 8; ++g) c[g] = codes4<T>(b, u, g);
  const float a = T::scale(b, u, 0);
  float mn = 0.f;
  if constexpr (T::kHasMin) mn = T::min(b, u);
  AKV_UNROLL
  for (int v = 0; v < NV; ++v) {
    const int4* xp = reinterpret_cast<const int4*>(xq.qx + v * cols + xb * 32);
    const int4 x0 = ldg(xp), x1 = ldg(xp + 1);
    const int xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    int s = 0;
    AKV_UNROLL
    for (int g = 0; g < 8; ++g) s = dp4a(int(c[g]), xs[g], s);
    const float2 d = ldg(xq.ds + v * (cols / 32) + xb);
    float t = mul_rn(a, float(s));
    if constexpr (T::kHasMin) t = fmaf(mn, d.y, t);
    acc[v] = fmaf(d.x, t, acc[v]);
  }
}

/// Q6_K item (h, j): bytes 8j..8j+7 of the ql/qh rows of half h, i.e. elements
/// 8j..8j+7 of the four units u = 4h + k; x blocks from xb0 (the block's first).
template <int NV>
AKV_QHD void dot_q6k_item(const uint8_t* b, int h, int j, int64_t xb0, XQuant xq, int64_t cols, float* acc) {
  uint32_t c[4][2];
  float a[4];
  AKV_UNROLL
  for (int k = 0; k < 4; ++k) {
    c[k][0] = codes4<Q6_K>(b, 4 * h + k, 2 * j);
    c[k][1] = codes4<Q6_K>(b, 4 * h + k, 2 * j + 1);
    a[k] = Q6_K::scale(b, 4 * h + k, 2 * j);
  }
  AKV_UNROLL
  for (int v = 0; v < NV; ++v) {
    AKV_UNROLL
    for (int k = 0; k < 4; ++k) {
      const int64_t xb = xb0 + 4 * h + k;
      const int2 x = ldg(reinterpret_cast<const int2*>(xq.qx + v * cols + xb * 32 + 8 * j));
      const int s = dp4a(int(c[k][1]), x.y, dp4a(int(c[k][0]), x.x, 0));
      const float d = ldg(xq.ds + v * (cols / 32) + xb).x;
      acc[v] = fmaf(d, mul_rn(a[k], float(s)), acc[v]);
    }
  }
}

/// Work item `item` (< items of the chunk) of the chunk whose first block is
/// block `blk0` of the row and sits at `base` (a copy of the row's bytes).
template <class T, int NV>
AKV_QHD void dot_item(const uint8_t* base, int item, int blk0, XQuant xq, int64_t cols, float* acc) {
  using Tl = Tiling<T>;
  const int blk = item / Tl::kItemsPerBlock, part = item % Tl::kItemsPerBlock;
  const uint8_t* bp = base + blk * T::kBytes;
  const int64_t xb0 = int64_t(blk0 + blk) * T::kUnits;
  if constexpr (std::is_same_v<T, Q6_K>) {
    dot_q6k_item<NV>(bp, part >> 2, part & 3, xb0, xq, cols, acc);
  } else {
    dot_unit<T, NV>(bp, part, xb0 + part, xq, cols, acc);
  }
}

}  // namespace activekv::cuda::qdot
