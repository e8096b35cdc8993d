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
#include "pdl.cuh"
#include "register_items.cuh"
#include "ring_matvec.h"

namespace activekv::cuda::regmv {
namespace {

constexpr int kWarps = mvhost::kWarpsPerCta;

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
  if (n_vec == 1 && ringmv::run(w, xq, y, accumulate, stream)) return;  // the ring, where it is on and reads w
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
