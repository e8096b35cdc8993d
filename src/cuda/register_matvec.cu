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
// shared memory, no per-granule bookkeeping. Three kinds of matrix qualify
// (RegItems below): the 32-element types in the split layout (an item is a
// block: its codes one or two 16-byte loads, quant_split.cuh), Q4_K in
// its GGUF layout (an item is a unit of a 144-byte super-block: the
// 16-byte header and the unit's 32-byte nibble group, quant_kregs.cuh), and
// Q6_K in the split layout (an item is the chunked kernel's Q6_K item, 8
// columns of 4 units: four 8-byte loads and d, quant_q6kregs.cuh).
#include <cuda_runtime.h>


#include "register_matvec.h"
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

/// How the register kernel reads items of a matrix of type T (kOk), how
/// many it has in flight per lane and row (kPerDepth<R> times the depth D),
/// and the x and dot of an item (the chunked kernel's: quant_dot.cuh).
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
  template <int NV>
  __device__ __forceinline__ static void load_x(int item, const XQuant& xq, int64_t cols, X<NV>& x) {
    qdot::load_unit_x<NV>(item, xq, cols, x);
  }
  template <int NV, class Regs>
  __device__ __forceinline__ static void dot(const Regs& regs, int item, const X<NV>& x, float* acc) {
    qdot::dot_unit_x<T, NV>(regs, item % T::kUnits, x, acc);
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
  __device__ __forceinline__ static void load(const uint8_t* w, int64_t rows, int64_t, int64_t r, int item,
                                              int n_blocks, Regs& regs) {
    qsplit::load_regs<T>(qsplit::split_block<T>(w, rows, r, item, n_blocks), regs);
  }
};

/// Q6_K in the split layout: an item is item % 8 = (h, j) = (half, 8-byte
/// column group) of super-block item / 8, as the chunked kernel's Q6_K item
/// (quant_dot.cuh: Tiling, dot_q6k_item_x), so the lanes meet the same items
/// in the same order. 9 registers an item: 4 per row and depth, 2 at 2 rows,
/// 1 at 4.
template <>
struct RegItems<qblk::Q6_K> {
  static constexpr bool kOk = true;
  template <int R>
  static constexpr int kPerDepth = R >= 4 ? 1 : R >= 2 ? 2 : 4;
  using Regs = qsplit::Q6kItemRegs;
  __device__ __forceinline__ static void load(const uint8_t* w, int64_t rows, int64_t, int64_t r, int item,
                                              int n_blocks, Regs& regs) {
    const int part = item & 7;
    qsplit::load_q6k_item(qsplit::split_block<qblk::Q6_K>(w, rows, r, item >> 3, n_blocks), part >> 2, part & 3,
                          regs);
  }
  template <int NV>
  using X = qdot::Q6kX<NV>;
  template <int NV>
  __device__ __forceinline__ static void load_x(int item, const XQuant& xq, int64_t cols, X<NV>& x) {
    const int part = item & 7;
    qdot::load_q6k_x<NV>(part >> 2, part & 3, int64_t(item >> 3) * qblk::Q6_K::kUnits, xq, cols, x);
  }
  template <int NV>
  __device__ __forceinline__ static void dot(const Regs& regs, int item, const X<NV>& x, float* acc) {
    const int part = item & 7;
    qdot::dot_q6k_item_x<NV>(regs, part >> 2, part & 3, x, acc);
  }
};

/// Q4_K in the GGUF layout: an item is unit item % 8 of super-block item / 8.
/// Each lane loads its unit whole (header + 32-byte nibble group: 3 x 16
/// bytes in 12 registers, the group loaded by both lanes of the unit pair);
/// 4 units per row and depth, 1 at 4 rows (at 4 x 4 the 8-vector kernel
/// spilled 736 bytes).
template <>
struct RegItems<qblk::Q4_K> : UnitItems<qblk::Q4_K> {
  static constexpr bool kOk = true;
  template <int R>
  static constexpr int kPerDepth = R >= 4 ? 1 : 4;
  using Regs = qkregs::UnitRegs;
  __device__ __forceinline__ static void load(const uint8_t* w, int64_t, int64_t row_bytes, int64_t r, int item,
                                              int, Regs& regs) {
    qkregs::load_unit(w + r * row_bytes + int64_t(item >> 3) * qblk::Q4_K::kBytes, item & 7, regs);
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

  float acc[R * NV];
#pragma unroll
  for (int k = 0; k < R * NV; ++k) acc[k] = 0.f;

  typename Items::Regs item_regs[U][R];
  auto load = [&](int i0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = i0 + 32 * u;
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (i < n_items && r < n_rows) Items::load(w, rows, row_bytes, row0 + r, i, n_blocks, item_regs[u][r]);
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
      const int i = i0 + 32 * u;
      if (i >= n_items) break;
      typename Items::template X<NV> x;
      Items::template load_x<NV>(i, xq, cols, x);
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (r < n_rows) Items::template dot<NV>(item_regs[u][r], i, x, acc + r * NV);
    }
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
  for (int k = 0; k < SplitOf<T>::kPayload; ++k) p[k] = s[SplitOf<T>::kPayloadAt + k];
}

/// Calls f(T{}) for the split types.
template <class F>
void dispatch_split(gguf::TensorType t, F&& f) {
  qblk::dispatch_block_type(t, [&](auto traits) {
    if constexpr (SplitOf<decltype(traits)>::kOk) f(traits);
  });
}

/// Calls f(T{}) for w's type where the register kernel reads it in w's
/// layout (mvhost::reads_registers: split types split, Q4_K in the GGUF
/// layout); throws otherwise -- the caller checked.
template <class F>
void dispatch_registers(const DeviceMatrix& w, F&& f) {
  bool done = false;
  qblk::dispatch_block_type(w.type, [&](auto traits) {
    using T = decltype(traits);
    if constexpr (RegItems<T>::kOk) {
      if (SplitOf<T>::kOk == (w.layout == WeightLayout::Split)) f(traits), done = true;
    }
  });
  if (!done) throw InvalidArgument("register matvec: no register kernel for the " + mvhost::shape_str(w));
}

}  // namespace

void run(const DeviceMatrix& w, const XQuant& xq, int n_vec, float* y, bool accumulate, cudaStream_t stream) {
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
