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

/// x of one 32-element unit for NV vectors: its int8 codes (8 words) and
/// {d, sum q}. Loaded once per work item and applied to every row a warp holds.
template <int NV>
struct UnitX {
  int xs[NV][8];
  float2 d[NV];
};

/// x of the unit whose int8 codes start at qx and whose {d, sum q} is *ds,
/// for vector 0; vector v's are v * cols codes and v * cols / 32 entries on.
template <int NV>
AKV_QHD void load_unit_x_at(const int8_t* qx, const float2* ds, int64_t cols, UnitX<NV>& x) {
  AKV_UNROLL
  for (int v = 0; v < NV; ++v) {
    const int4* xp = reinterpret_cast<const int4*>(qx + v * cols);
    const int4 x0 = ldg(xp), x1 = ldg(xp + 1);
    x.xs[v][0] = x0.x, x.xs[v][1] = x0.y, x.xs[v][2] = x0.z, x.xs[v][3] = x0.w;
    x.xs[v][4] = x1.x, x.xs[v][5] = x1.y, x.xs[v][6] = x1.z, x.xs[v][7] = x1.w;
    x.d[v] = ldg(ds + v * (cols / 32));
  }
}

/// x of unit xb (the unit's 32 elements of every vector).
template <int NV>
AKV_QHD void load_unit_x(int64_t xb, XQuant xq, int64_t cols, UnitX<NV>& x) {
  load_unit_x_at<NV>(xq.qx + xb * 32, xq.ds + xb, cols, x);
}

/// dot_unit_x's arithmetic once the unit's raw codes c (word g: elements 4g
/// .. 4g + 3), scale a and (T::kHasMin) min mn are known: the one sequence
/// of integer and float operations every reader of a unit shares
/// (qkregs::dot_unit_x too), so their bits cannot drift apart.
template <class T, int NV>
AKV_QHD void dot_unit_codes(const uint32_t (&c)[8], float a, float mn, const UnitX<NV>& x, float* acc) {
  AKV_UNROLL
  for (int v = 0; v < NV; ++v) {
    int s = 0;
    AKV_UNROLL
    for (int g = 0; g < 8; ++g) s = dp4a(int(c[g]), x.xs[v][g], s);
    if constexpr (T::kOffset != 0) s -= T::kOffset * int(x.d[v].y);
    float t = mul_rn(a, float(s));
    if constexpr (T::kHasMin) t = fmaf(mn, x.d[v].y, t);
    acc[v] = fmaf(x.d[v].x, t, acc[v]);
  }
}

/// Dot of unit u of block b (a byte source: quant_blocks.cuh) with x, added to acc[v] for every vector:
/// acc += d_x * (A * sum(code * q) + B * sum(q)). sum(code * q) is taken as
/// sum(raw * q) - kOffset * sum(q) (d.y holds sum(q), an exact integer):
/// the same int32, without subtracting kOffset from every code byte -- the
/// H200 profile showed this kernel instruction-bound.
template <class T, int NV, class S>
AKV_QHD void dot_unit_x(const S& b, int u, const UnitX<NV>& x, float* acc) {
  uint32_t c[8];
  AKV_UNROLL
  for (int g = 0; g < 8; ++g) c[g] = T::raw4(b, u, g);
  float mn = 0.f;
  if constexpr (T::kHasMin) mn = T::min(b, u);
  dot_unit_codes<T, NV>(c, T::scale(b, u, 0), mn, x, acc);
}

/// x of a Q6_K item (h, j): bytes 8j..8j+7 of the four units 4h + k, and their d.
template <int NV>
struct Q6kX {
  int2 xs[NV][4];
  float d[NV][4];
};

/// x of a Q6_K item whose first unit's bytes 8j.. start at qx and whose
/// first unit's {d, sum q} is *ds (vector 0, as load_unit_x_at): the four
/// units are 32 codes and one entry apart.
template <int NV>
AKV_QHD void load_q6k_x_at(const int8_t* qx, const float2* ds, int64_t cols, Q6kX<NV>& x) {
  AKV_UNROLL
  for (int v = 0; v < NV; ++v) {
    AKV_UNROLL
    for (int k = 0; k < 4; ++k) {
      x.xs[v][k] = ldg(reinterpret_cast<const int2*>(qx + v * cols + 32 * k));
      x.d[v][k] = ldg(ds + v * (cols / 32) + k).x;
    }
  }
}

/// x of item (h, j) of the super-block whose first unit is xb0.
template <int NV>
AKV_QHD void load_q6k_x(int h, int j, int64_t xb0, XQuant xq, int64_t cols, Q6kX<NV>& x) {
  const int64_t xb = xb0 + 4 * h;
  load_q6k_x_at<NV>(xq.qx + xb * 32 + 8 * j, xq.ds + xb, cols, x);
}

/// Q6_K item (h, j): bytes 8j..8j+7 of the ql/qh rows of half h, i.e. elements
/// 8j..8j+7 of the four units u = 4h + k, dotted with their x. b is a byte
/// source (quant_blocks.cuh): the block's bytes, or the item in registers
/// (qsplit::Q6kItemRegs).
template <int NV, class S>
AKV_QHD void dot_q6k_item_x(const S& b, int h, int j, const Q6kX<NV>& x, float* acc) {
  // The codes are raw - 32 (raw in 0..63). With one vector, sum((raw - 32) *
  // q) is taken as sum(raw * q) + sum(-32 * q), the second term two more
  // dp4a against bytes of -32: the same int32, and 4 instructions per unit
  // fewer than subtracting 32 from every byte (3 per word: sub_bytes). That
  // costs 2 dp4a per unit *per vector* against 6 per unit per row, so
  // several vectors keep the subtraction.
  constexpr bool kOffsetByDot = NV == 1;
  constexpr int kMinus32 = int(0xe0e0e0e0u);  // four bytes of -32
  uint32_t c[4][2];
  float a[4];
  AKV_UNROLL
  for (int k = 0; k < 4; ++k) {
    if constexpr (kOffsetByDot) {
      c[k][0] = Q6_K::raw4(b, 4 * h + k, 2 * j);
      c[k][1] = Q6_K::raw4(b, 4 * h + k, 2 * j + 1);
    } else {
      c[k][0] = codes4<Q6_K>(b, 4 * h + k, 2 * j);
      c[k][1] = codes4<Q6_K>(b, 4 * h + k, 2 * j + 1);
    }
    a[k] = Q6_K::scale(b, 4 * h + k, 2 * j);
  }
  AKV_UNROLL
  for (int v = 0; v < NV; ++v) {
    AKV_UNROLL
    for (int k = 0; k < 4; ++k) {
      int s = 0;
      if constexpr (kOffsetByDot) s = dp4a(kMinus32, x.xs[v][k].y, dp4a(kMinus32, x.xs[v][k].x, 0));
      s = dp4a(int(c[k][1]), x.xs[v][k].y, dp4a(int(c[k][0]), x.xs[v][k].x, s));
      acc[v] = fmaf(x.d[v][k], mul_rn(a[k], float(s)), acc[v]);
    }
  }
}

/// Work item `item` (< items of the chunk) of a chunk whose first block is
/// block `blk0` of R rows, the chunk of row r at base[r] (a copy of the
/// row's bytes): the item's x is loaded once and dotted with each row's
/// block, added to acc[r * NV + v]. Per row, the arithmetic and its order
/// are those of R = 1 (what the emulation runs).
template <class T, int NV, int R = 1>
AKV_QHD void dot_item(const uint8_t* const* base, int item, int blk0, XQuant xq, int64_t cols, float* acc,
                      int n_rows = R) {
  using Tl = Tiling<T>;
  const int blk = item / Tl::kItemsPerBlock, part = item % Tl::kItemsPerBlock;
  const int64_t xb0 = int64_t(blk0 + blk) * T::kUnits;
  if constexpr (std::is_same_v<T, Q6_K>) {
    Q6kX<NV> x;
    load_q6k_x<NV>(part >> 2, part & 3, xb0, xq, cols, x);
    AKV_UNROLL
    for (int r = 0; r < R; ++r)
      if (r < n_rows) dot_q6k_item_x<NV>(base[r] + blk * T::kBytes, part >> 2, part & 3, x, acc + r * NV);
  } else {
    UnitX<NV> x;
    load_unit_x<NV>(xb0 + part, xq, cols, x);
    AKV_UNROLL
    for (int r = 0; r < R; ++r)
      if (r < n_rows) dot_unit_x<T, NV>(base[r] + blk * T::kBytes, part, x, acc + r * NV);
  }
}

}  // namespace activekv::cuda::qdot
