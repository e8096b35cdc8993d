// The block-type matvec on split matrices (split_matvec.h).
//
// A warp takes R rows; lane l takes blocks l, l + 32, l + 64, ... of each,
// in that order -- the order in which the chunked kernel's lane l meets them
// (items l and l + 32 of each 64-block chunk) -- and dots each with the
// block's int8 x (loaded once for the R rows) through the same dot_unit_x,
// then the warp sums the lanes as every matvec does (write_row). So each row
// is bitwise the chunked kernel's on the same matrix in the GGUF layout, and
// the CPU emulation of that kernel (tests/cuda/matvec_emulation.h) holds.
//
// What changes is how the bytes arrive: a block's codes are one (two for
// Q8_0) 16-byte loads straight into registers, U blocks per lane issued
// before any is used (U * R * 16 bytes in flight per lane), no shared
// memory, no per-granule bookkeeping.
#include <cuda_runtime.h>

#include "split_matvec.h"
#include "pdl.cuh"
#include "quant_split.cuh"

namespace activekv::cuda::splitmv {
namespace {

using qdot::XQuant;
using qsplit::SplitOf;
using qsplit::SplitRegs;

constexpr int kWarps = mvhost::kWarpsPerCta;

/// Blocks per lane loaded before the first is used: D x 4 x 16 bytes of
/// codes per row (D x 2 x 32 for Q8_0); D = 1, or 2 for one vector (mvhost::split_shape).
template <class T, int D>
inline constexpr int kBlocksInFlight = D * (SplitOf<T>::kPayload == 16 ? 4 : 2);

template <class T, int NV, int R, int D>
__device__ __forceinline__ void split_cta(const uint8_t* __restrict__ w, int64_t rows, int n_blocks, XQuant xq,
                                          int64_t cols, float* __restrict__ y, bool accumulate, int64_t cta) {
  constexpr int U = kBlocksInFlight<T, D>;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row0 = (cta * kWarps + warp) * R;
  if (row0 >= rows) return;
  const int n_rows = int(min(int64_t(R), rows - row0));

  float acc[R * NV];
#pragma unroll
  for (int k = 0; k < R * NV; ++k) acc[k] = 0.f;

  SplitRegs<T> blk[U][R];
  auto load = [&](int b0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int b = b0 + 32 * u;
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (b < n_blocks && r < n_rows)
          qsplit::load_regs<T>(qsplit::split_block<T>(w, rows, row0 + r, b, n_blocks), blk[u][r]);
    }
  };
  // The first blocks' loads go out before the wait for x (pdl.cuh): the
  // weights stream while the kernel before this one drains.
  load(lane);
  pdl::begin();
  for (int b0 = lane; b0 < n_blocks; b0 += 32 * U) {
    if (b0 != lane) load(b0);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int b = b0 + 32 * u;
      if (b >= n_blocks) break;
      qdot::UnitX<NV> x;
      qdot::load_unit_x<NV>(b, xq, cols, x);
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (r < n_rows) qdot::dot_unit_x<T, NV>(blk[u][r], 0, x, acc + r * NV);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (r < n_rows) mvkern::write_row<NV>(acc + r * NV, y, rows, row0 + r, accumulate);
}

template <class T, int NV, int R, int D>
__global__ void __launch_bounds__(kWarps * 32)
    split_matvec_kernel(const uint8_t* __restrict__ w, int64_t rows, int n_blocks, XQuant xq, int64_t cols,
                        float* __restrict__ y, bool accumulate) {
  split_cta<T, NV, R, D>(w, rows, n_blocks, xq, cols, y, accumulate, blockIdx.x);
}

template <class T, int NV, int R, int D>
__global__ void __launch_bounds__(kWarps * 32)
    split_matvec_group_kernel(mvkern::GroupArgs g, int n_blocks, XQuant xq, int64_t cols) {
  int64_t cta = 0;
  const int i = mvkern::group_part(g, cta);
  split_cta<T, NV, R, D>(g.w[i], g.rows[i], n_blocks, xq, cols, g.y[i], false, cta);
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
  for (int k = 0; k < SplitOf<T>::kHead; ++k) h[k] = s[k];
  for (int k = 0; k < SplitOf<T>::kPayload; ++k) p[k] = s[SplitOf<T>::kHead + k];
}

/// Calls f(T{}) for the split types.
template <class F>
void dispatch_split(gguf::TensorType t, F&& f) {
  qblk::dispatch_block_type(t, [&](auto traits) {
    if constexpr (SplitOf<decltype(traits)>::kOk) f(traits);
  });
}

}  // namespace

void run(const DeviceMatrix& w, const XQuant& xq, int n_vec, float* y, bool accumulate, cudaStream_t stream) {
  dispatch_split(w.type, [&](auto t) {
    using T = decltype(t);
    const int n_blocks = int(w.cols / T::kElems);
    mvkern::with_nv(n_vec, [&](auto nv) {
      constexpr int NV = decltype(nv)::value;
      const mvhost::SplitShape shape = mvhost::split_shape(w.rows, w.cols, NV, T::kBytes, T::kElems);
      mvkern::with_rows<NV>(shape.rows_per_warp, [&](auto r) {
        constexpr int kR = decltype(r)::value;
        const int64_t warps = (w.rows + kR - 1) / kR;
        with_depth<NV>(shape.depth, [&](auto d) {
          pdl::launch("matvec (split layout) kernel launch", split_matvec_kernel<T, NV, kR, decltype(d)::value>,
                      unsigned((warps + kWarps - 1) / kWarps), kWarps * 32, 0, stream,
                      static_cast<const uint8_t*>(w.data), w.rows, n_blocks, xq, w.cols, y, accumulate);
        });
      });
    });
  });
}

void run_group(const mvkern::GroupArgs& g, const mvhost::GroupPlan& plan, const DeviceMatrix& w0,
               const XQuant& xq, int n_vec, cudaStream_t stream) {
  dispatch_split(w0.type, [&](auto t) {
    using T = decltype(t);
    mvkern::with_nv(n_vec, [&](auto nv) {
      constexpr int NV = decltype(nv)::value;
      mvkern::with_rows<NV>(plan.rows_per_warp, [&](auto r) {
        with_depth<NV>(mvhost::split_depth() == 2 ? 2 : 1, [&](auto d) {  // a group: depth 1 unless forced
          pdl::launch("matvec group (split layout) kernel launch",
                      split_matvec_group_kernel<T, NV, decltype(r)::value, decltype(d)::value>, plan.ctas(),
                      kWarps * 32, 0, stream, g, int(w0.cols / T::kElems), xq, w0.cols);
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

}  // namespace activekv::cuda::splitmv
