// The register matvec (register_matvec.h): a block-type matvec whose
// weights go from HBM straight into registers.
//
// An item is a 32-element unit of a row; lane l takes items l, l + 32,
// l + 64, ... of each -- the order in which the chunked kernel's lane l
// meets them (items l and l + 32 of each 64-item chunk) -- and dots each
// with the unit's int8 x (loaded once for the R rows) through the same
// dot_unit_x, then the warp sums the lanes as every matvec does
// (write_row). So each row is bitwise the chunked kernel's on the same
// matrix in the GGUF layout, and the CPU emulation of that kernel
// (tests/cuda/matvec_emulation.h) holds.
//
// What changes is how the bytes arrive: an item's bytes are aligned loads
// straight into registers, U items per lane issued before any is used, no
// shared memory, no per-granule bookkeeping. It reads the split layout
// (quant_split.cuh), three kinds of item (RegItems below): the 32-element
// types' (an item is a block: its codes one or two 16-byte loads), Q4_K's
// (an item is a unit: its super-block's 16-byte head and its 16 bytes of
// nibbles, quant_kregs.cuh), and Q6_K's (the chunked kernel's Q6_K item, 8
// columns of 4 units: four 8-byte loads and d, quant_q6kregs.cuh).
#include <cuda_runtime.h>


#include "register_matvec.h"
#include "mma_matvec.h"
#include "pdl.cuh"
#include "quant_kregs.cuh"
#include "quant_q6kregs.cuh"
#include "quant_split.cuh"

namespace activekv::cuda::regmv {
namespace {

using qdot::XQuant;
using qsplit::SplitOf;
using qsplit::SplitRegs;

constexpr int kWarps = mvhost::kWarpsPerCta;

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

template <class T, int NV, int R, int D>
__device__ __forceinline__ void register_cta(const uint8_t* __restrict__ w, int64_t rows, int64_t row_bytes,
                                             int n_blocks, XQuant xq, int64_t cols, float* __restrict__ y,
                                             bool accumulate, int64_t cta) {
  using Items = RegItems<T>;
  constexpr int U = D * Items::template kPerDepth<R>;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row0 = (cta * kWarps + warp) * R;
  if (row0 >= rows) return;
  const int n_rows = int(min(int64_t(R), rows - row0));
  const int n_items = n_blocks * qdot::Tiling<T>::kItemsPerBlock;
  const int part = lane % qdot::Tiling<T>::kItemsPerBlock;  // every item of this lane's

  float acc[R * NV];
#pragma unroll
  for (int k = 0; k < R * NV; ++k) acc[k] = 0.f;

  // Rows past n_rows get addresses too, never read.
  typename Items::Lane at[R];
#pragma unroll
  for (int r = 0; r < R; ++r) at[r] = Items::lane_at(w, rows, row_bytes, row0 + r, n_blocks, lane);
  XAt x_at = Items::x_at(xq, lane);

  // Iteration t holds items i0 + 32u (u < U, i0 = lane + 32 U t): at[r] and
  // x_at are where the lane's item i0 is, item i0 + 32u is u steps on.
  typename Items::Regs item_regs[U][R];
  auto load = [&](int i0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (i0 + 32 * u < n_items && r < n_rows) Items::load(Items::advanced(at[r], u), item_regs[u][r]);
    }
  };
  // The first items' loads go out before the wait for x (pdl.cuh): the
  // weights stream while the kernel before this one drains.
  load(lane);
  pdl::begin();
  for (int i0 = lane; i0 < n_items; i0 += 32 * U) {
    if (i0 != lane) load(i0);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (i0 + 32 * u >= n_items) break;
      typename Items::template X<NV> x;
      Items::template load_x<NV>(x_at.at(u), cols, x);
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (r < n_rows) Items::template dot<NV>(item_regs[u][r], part, x, acc + r * NV);
    }
    // The next iteration's items are U steps on.
#pragma unroll
    for (int r = 0; r < R; ++r) at[r] = Items::advanced(at[r], U);
    x_at = x_at.at(U);
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (r < n_rows) mvkern::write_row<NV>(acc + r * NV, y, rows, row0 + r, accumulate);
}

template <class T, int NV, int R, int D>
__global__ void __launch_bounds__(kWarps * 32)
    register_matvec_kernel(const uint8_t* __restrict__ w, int64_t rows, int64_t row_bytes, int n_blocks,
                           XQuant xq, int64_t cols, float* __restrict__ y, bool accumulate) {
  register_cta<T, NV, R, D>(w, rows, row_bytes, n_blocks, xq, cols, y, accumulate, blockIdx.x);
}

template <class T, int NV, int R, int D>
__global__ void __launch_bounds__(kWarps * 32)
    register_matvec_group_kernel(mvkern::GroupArgs g, int64_t row_bytes, int n_blocks, XQuant xq, int64_t cols) {
  const mvkern::GroupPart m = mvkern::group_part(g);
  register_cta<T, NV, R, D>(m.w, m.rows, row_bytes, n_blocks, xq, cols, m.y, false, m.cta);
}

/// Calls f(std::integral_constant<int, D>) for `depth`, 2 for one vector only
/// (instantiated there only: several vectors hold R x NV accumulators already).
template <int NV, class F>
void with_depth(int depth, F&& f) {
  if constexpr (NV == 1) {
    if (depth == 2) return f(std::integral_constant<int, 2>{});
  }
  f(std::integral_constant<int, 1>{});
}

template <class T>
__global__ void repack_kernel(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst, int64_t rows,
                              int64_t n_blocks) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * n_blocks) return;
  const int64_t r = i / n_blocks, b = i % n_blocks;
  const uint8_t* s = src + i * T::kBytes;  // rows of whole blocks: block i of the matrix
  uint8_t* h = dst + qsplit::head_offset<T>(rows, r, b, n_blocks);
  uint8_t* p = dst + qsplit::payload_offset<T>(r, b, n_blocks);
  for (int k = 0; k < SplitOf<T>::kHead; ++k) h[k] = s[SplitOf<T>::kHeadAt + k];
  for (int k = 0; k < SplitOf<T>::kPayload; ++k) p[k] = qsplit::split_payload_byte<T>(s, k);
}

/// Calls f(T{}) for the split types.
template <class F>
void dispatch_split(gguf::TensorType t, F&& f) {
  qblk::dispatch_block_type(t, [&](auto traits) {
    if constexpr (SplitOf<decltype(traits)>::kOk) f(traits);
  });
}

/// Calls f(T{}) for w's type where the register kernel reads it: the split
/// layout (mvhost::reads_registers); throws otherwise -- the caller checked.
template <class F>
void dispatch_registers(const DeviceMatrix& w, F&& f) {
  bool done = false;
  qblk::dispatch_block_type(w.type, [&](auto traits) {
    using T = decltype(traits);
    if constexpr (RegItems<T>::kOk) {
      if (w.layout == WeightLayout::Split) f(traits), done = true;
    }
  });
  if (!done) throw InvalidArgument("register matvec: no register kernel for the " + mvhost::shape_str(w));
}

}  // namespace

void run(const DeviceMatrix& w, const XQuant& xq, int n_vec, float* y, bool accumulate, cudaStream_t stream) {
  if (mmamv::run(w, xq, n_vec, y, accumulate, stream)) return;  // several vectors, where the mma kernel is on
  dispatch_registers(w, [&](auto t) {
    using T = decltype(t);
    const int n_blocks = int(w.cols / T::kElems);
    mvkern::with_nv(n_vec, [&](auto nv) {
      constexpr int NV = decltype(nv)::value;
      const mvhost::SplitShape shape = mvhost::split_shape(w.rows, w.cols, NV, T::kBytes, T::kElems);
      mvkern::with_rows<NV>(shape.rows_per_warp, [&](auto r) {
        constexpr int kR = decltype(r)::value;
        const int64_t warps = (w.rows + kR - 1) / kR;
        with_depth<NV>(shape.depth, [&](auto d) {
          constexpr int kD = decltype(d)::value;
          pdl::launch("matvec (register) kernel launch", register_matvec_kernel<T, NV, kR, kD>,
                      unsigned((warps + kWarps - 1) / kWarps), kWarps * 32, 0, stream,
                      static_cast<const uint8_t*>(w.data), w.rows, int64_t(w.row_bytes), n_blocks, xq, w.cols, y,
                      accumulate);
        });
      });
    });
  });
}

void run_group(const mvkern::GroupArgs& g, const mvhost::GroupPlan& plan, const DeviceMatrix& w0,
               const XQuant& xq, int n_vec, cudaStream_t stream) {
  if (mmamv::run_group(g, w0, xq, n_vec, stream)) return;
  dispatch_registers(w0, [&](auto t) {
    using T = decltype(t);
    mvkern::with_nv(n_vec, [&](auto nv) {
      constexpr int NV = decltype(nv)::value;
      mvkern::with_rows<NV>(plan.rows_per_warp, [&](auto r) {
        with_depth<NV>(mvhost::split_depth() == 2 ? 2 : 1, [&](auto d) {  // a group: depth 1 unless forced
          pdl::launch("matvec group (register) kernel launch",
                      register_matvec_group_kernel<T, NV, decltype(r)::value, decltype(d)::value>, plan.ctas(),
                      kWarps * 32, 0, stream, g, int64_t(w0.row_bytes), int(w0.cols / T::kElems), xq, w0.cols);
        });
      });
    });
  });
}

void repack(const void* src_gguf, const DeviceMatrix& dst, cudaStream_t stream) {
  dispatch_split(dst.type, [&](auto t) {
    using T = decltype(t);
    const int64_t n_blocks = dst.cols / T::kElems, total = dst.rows * n_blocks;
    if (total == 0) return;
    constexpr int kThreads = 256;
    repack_kernel<T><<<unsigned((total + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        static_cast<const uint8_t*>(src_gguf), static_cast<uint8_t*>(const_cast<void*>(dst.data)), dst.rows,
        n_blocks);
  });
}

}  // namespace activekv::cuda::regmv
