// Internal to the CUDA backend: how the register and ring matvecs
// (register_matvec.cu, ring_matvec.cu) meet the items of a split matrix --
// where a lane's items and their x are, how an item loads into registers,
// and its dot -- per type (RegItems<T>). Both kernels take the same items in
// the same order per lane and sum them with these dots, so they give the
// same bits; only how the bytes arrive differs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "quant_dot.cuh"
#include "quant_kregs.cuh"
#include "quant_q6kregs.cuh"
#include "quant_split.cuh"

namespace activekv::cuda::regmv {

using qdot::XQuant;
using qsplit::SplitOf;
using qsplit::SplitRegs;

/// Where a lane's x is: the x of its first item (item `lane`). A lane's
/// items are 32 apart and an item is 32 elements of x, so its s-th item's x
/// is s x 1024 codes and s x 32 {d, sum q} entries on, for every type.
struct XAt {
  const int8_t* qx;
  const float2* ds;
  __device__ __forceinline__ XAt at(int s) const { return {qx + 1024 * s, ds + 32 * s}; }
};

/// How the register kernel reads items of a matrix of type T (kOk), how
/// many it has in flight per lane and row (kPerDepth<R> times the depth D),
/// and the x and dot of an item (the chunked kernel's: quant_dot.cuh).
///
/// A lane's items are lane, lane + 32, lane + 64, ...: each whole blocks
/// (kStep bytes of the matrix) past the one before in the same place within
/// its block (`part`). So a lane computes where its first item is once
/// (Lane, from lane_at) and reaches its s-th by a constant offset (load's s
/// is a compile-time constant in the unrolled loop, so the offsets are load
/// immediates). Computing each item's address from its index took about 45
/// of Q6_K's 187 instructions per item (SASS at ed60a9e).
template <class T, class = void>
struct RegItems {
  static constexpr bool kOk = false;
};

/// An item that is one 32-element unit: x is the unit's (UnitX), the dot
/// dot_unit_x.
template <class T>
struct UnitItems {
  template <int NV>
  using X = qdot::UnitX<NV>;
  __device__ __forceinline__ static XAt x_at(const XQuant& xq, int lane) { return {xq.qx + 32 * lane, xq.ds + lane}; }
  template <int NV>
  __device__ __forceinline__ static void load_x(const XAt& a, int64_t cols, X<NV>& x) {
    qdot::load_unit_x_at<NV>(a.qx, a.ds, cols, x);
  }
  template <int NV, class Regs>
  __device__ __forceinline__ static void dot(const Regs& regs, int part, const X<NV>& x, float* acc) {
    qdot::dot_unit_x<T, NV>(regs, part, x, acc);
  }
};

/// Split-layout 32-element types: an item is a block (one unit); 4 blocks of
/// 16-byte codes per row and depth (2 of Q8_0's 32).
template <class T>
struct RegItems<T, std::enable_if_t<SplitOf<T>::kOk && T::kUnits == 1>> : UnitItems<T> {
  static constexpr bool kOk = true;
  template <int R>
  static constexpr int kPerDepth = SplitOf<T>::kPayload == 16 ? 4 : 2;
  using Regs = SplitRegs<T>;
  using Lane = qsplit::SplitPtr<T>;
  __device__ __forceinline__ static Lane lane_at(const uint8_t* w, int64_t rows, int64_t, int64_t r, int n_blocks,
                                                 int lane) {
    return qsplit::split_block<T>(w, rows, r, lane, n_blocks);
  }
  __device__ __forceinline__ static Lane advanced(const Lane& a, int s) {
    return {a.head + 32 * SplitOf<T>::kHead * s, a.payload + 32 * SplitOf<T>::kPayload * s};
  }
  __device__ __forceinline__ static void load(const Lane& a, Regs& regs) { qsplit::load_regs<T>(a, regs); }
};

/// Q6_K in the split layout: an item is item % 8 = (h, j) = (half, 8-byte
/// column group) of super-block item / 8, as the chunked kernel's Q6_K item
/// (quant_dot.cuh: Tiling, dot_q6k_item_x), so the lanes meet the same items
/// in the same order. 9 registers an item: 4 per row and depth, 2 at 2 rows,
/// 1 at 4. A lane's next item is 4 super-blocks on.
template <>
struct RegItems<qblk::Q6_K> {
  static constexpr bool kOk = true;
  template <int R>
  static constexpr int kPerDepth = R >= 4 ? 1 : R >= 2 ? 2 : 4;
  using Regs = qsplit::Q6kItemRegs;
  using Lane = qsplit::Q6kItemAt;
  static constexpr int kBlocksPerStep = 32 / 8;
  __device__ __forceinline__ static Lane lane_at(const uint8_t* w, int64_t rows, int64_t, int64_t r, int n_blocks,
                                                 int lane) {
    const int part = lane & 7;
    return qsplit::q6k_item_at(qsplit::split_block<qblk::Q6_K>(w, rows, r, lane >> 3, n_blocks), part >> 2, part & 3);
  }
  __device__ __forceinline__ static Lane advanced(const Lane& a, int s) {
    constexpr int kPayloadStep = kBlocksPerStep * SplitOf<qblk::Q6_K>::kPayload;
    constexpr int kHeadStep = kBlocksPerStep * SplitOf<qblk::Q6_K>::kHead;
    return {a.ql + kPayloadStep * s, a.qh + kPayloadStep * s, a.sc + kPayloadStep * s, a.d + kHeadStep * s};
  }
  __device__ __forceinline__ static void load(const Lane& a, Regs& regs) { qsplit::load_q6k_item(a, regs); }
  template <int NV>
  using X = qdot::Q6kX<NV>;
  __device__ __forceinline__ static XAt x_at(const XQuant& xq, int lane) {
    const int part = lane & 7, h = part >> 2, j = part & 3;
    const int xb = (lane >> 3) * qblk::Q6_K::kUnits + 4 * h;  // item lane's first unit
    return {xq.qx + 32 * xb + 8 * j, xq.ds + xb};
  }
  template <int NV>
  __device__ __forceinline__ static void load_x(const XAt& a, int64_t cols, X<NV>& x) {
    qdot::load_q6k_x_at<NV>(a.qx, a.ds, cols, x);
  }
  template <int NV>
  __device__ __forceinline__ static void dot(const Regs& regs, int part, const X<NV>& x, float* acc) {
    qdot::dot_q6k_item_x<NV>(regs, part >> 2, part & 3, x, acc);
  }
};

/// Q4_K in the split layout: an item is unit item % 8 of super-block item /
/// 8, the lane's unit (item % 8 = lane % 8) the same in each. 8 registers a
/// unit (the head's 16 bytes and the unit's 16 payload bytes,
/// quant_kregs.cuh); 4 units per row and depth, 1 at 4 rows (at 4 x 4 the
/// 8-vector kernel spilled 736 bytes with 12 registers a unit). A lane's
/// next unit is 4 super-blocks on.
template <>
struct RegItems<qblk::Q4_K> : UnitItems<qblk::Q4_K> {
  static constexpr bool kOk = true;
  template <int R>
  static constexpr int kPerDepth = R >= 4 ? 1 : 4;
  using Regs = qkregs::UnitRegs;
  using Lane = qkregs::UnitAt;
  static constexpr int kBlocksPerStep = 32 / 8;
  __device__ __forceinline__ static Lane lane_at(const uint8_t* w, int64_t rows, int64_t, int64_t r, int n_blocks,
                                                 int lane) {
    return qkregs::unit_at(qsplit::split_block<qblk::Q4_K>(w, rows, r, lane >> 3, n_blocks), lane & 7);
  }
  __device__ __forceinline__ static Lane advanced(const Lane& a, int s) {
    return {a.head + kBlocksPerStep * SplitOf<qblk::Q4_K>::kHead * s,
            a.payload + kBlocksPerStep * SplitOf<qblk::Q4_K>::kPayload * s};
  }
  __device__ __forceinline__ static void load(const Lane& a, Regs& regs) { qkregs::load_unit(a, regs); }
  template <int NV>
  __device__ __forceinline__ static void dot(const Regs& regs, int part, const X<NV>& x, float* acc) {
    qkregs::dot_unit_x<NV>(regs, part, x, acc);
  }
};

}  // namespace activekv::cuda::regmv
