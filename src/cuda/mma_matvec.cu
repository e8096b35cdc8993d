// The tensor-core matvec for several vectors (mma_matvec.h).
//
// Why: at 8 vectors the register kernel's dp4a work grows with the vectors,
// so a batched decode step reads its weights at ~1 TB/s (issue 16: of a
// round of 8 sequences at 32K, the matvecs were ~40 %). Here one
// mma.m16n8k32 (int8, exact int32 sums) dots a 32-element block of 16 rows
// with the same block of 8 vectors: the block's integer dot for 128
// (row, vector) pairs in one instruction.
//
// Same bits as the register kernel. Per (row, vector) that kernel's lane l
// sums the blocks l, l + 32, l + 64, ... in that order (each block's int32 s
// to a float by qdot::dot_unit_codes' sequence: s - kOffset sum(q), times
// the row's scale, + min sum(q), fmaf with x's d), then the warp adds the 32
// lane sums by an xor butterfly (mvkern::write_row). Here the int32 s of a
// block is the mma's (the same integer), turned to a float by the same
// sequence, summed per "lane slot" l over the same blocks in the same
// order; and the 32 slot sums are added by the butterfly's own tree: at
// level k it adds the sums whose slots differ in bit 4 - k, which in the
// order m = bitrev5(l) is the plain balanced tree over m. So each warp of a
// CTA takes 8 consecutive m (a subtree of 8 slots) and the CTA adds the
// four subtrees ((w0 + w1) + (w2 + w3)). Float addition is commutative, so
// only the tree's shape matters. Rows and vectors are independent in the
// mma, so a row's bits do not depend on how many vectors ride along.
//
// How the weights arrive: the CTA's 16 rows (payloads and heads) are copied
// into shared memory whole, coalesced (consecutive threads, consecutive 16
// bytes: cp.async), and the fragments are read from there. Reading them
// from global memory in fragment shape (56dcf9f: lane (g, q) takes word q of
// a block of rows g and g + 8) touched 8 lines for 128 useful bytes a warp
// load and ran 2.7-9.7x slower than the register kernel. Rows are padded by
// 16 bytes so that the 32 lanes' fragment reads fall in distinct banks. So
// a tile must fit: a row of at most 256 blocks (8192 columns) whose payload
// and heads are whole 16-byte pieces; other matrices keep the register kernel.
#include <cuda_runtime.h>

#include <utility>

#include "mma_matvec.h"
#include "int8s_tc_fragments.cuh"  // mma_s8_16832
#include "matvec_host.h"
#include "matvec_kernel_util.cuh"
#include "mma_util.cuh"
#include "once_per_device.h"
#include "pdl.cuh"
#include "quant_split.cuh"

namespace activekv::cuda::mmamv {
namespace {

using qdot::XQuant;
using qsplit::SplitOf;
using qsplit::SplitPtr;

constexpr int kWarps = 4;          // a CTA: one tile of 16 rows, 8 of the 32 lane slots a warp
constexpr int kTileRows = 16;
constexpr int kSlotsPerWarp = 32 / kWarps;

/// The 32-element split types whose codes are bytes < 0x80 or signed bytes
/// (T::raw4): Q4_0, Q4_1, Q8_0 (Q5_0's fifth bits later).
template <class T>
constexpr bool kReads = SplitOf<T>::kOk && T::kUnits == 1 && T::kType != gguf::TensorType::Q5_0;

__device__ __forceinline__ int bitrev5(int m) { return int(__brev(uint32_t(m)) >> 27); }

/// One block of the warp's slot: the A fragment of rows g and g + 8, their
/// scales (and mins), the B fragment of vector g, and {d, sum q} of vectors
/// 2q, 2q + 1.
template <class T>
struct BlockRegs {
  uint4 a;
  float scale[2], mn[2];
  uint32_t b0, b1;
  float2 ds[2];
};

template <class T, int NV>
__device__ __forceinline__ void load_block(const SplitPtr<T> (&row)[2], int b, const XQuant& xq, int64_t cols,
                                           int n_blocks, int g, int q, BlockRegs<T>& r) {
  SplitPtr<T> blk[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    blk[h] = {row[h].head + b * SplitOf<T>::kHead, row[h].payload + b * SplitOf<T>::kPayload};
    r.scale[h] = T::scale(blk[h], 0, 0);
    r.mn[h] = 0.f;
    if constexpr (T::kHasMin) r.mn[h] = T::min(blk[h], 0);
  }
  // a0, a1: elements 4q .. 4q + 3 of rows g, g + 8; a2, a3: elements 16 + 4q ..
  r.a = make_uint4(T::raw4(blk[0], 0, q), T::raw4(blk[1], 0, q), T::raw4(blk[0], 0, q + 4), T::raw4(blk[1], 0, q + 4));
  r.b0 = r.b1 = 0u;
  if (g < NV) {
    const int8_t* xp = xq.qx + int64_t(g) * cols + 32 * int64_t(b) + 4 * q;
    r.b0 = __ldg(reinterpret_cast<const uint32_t*>(xp));
    r.b1 = __ldg(reinterpret_cast<const uint32_t*>(xp + 16));
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int v = 2 * q + k;
    r.ds[k] = v < NV ? __ldg(xq.ds + int64_t(v) * n_blocks + b) : make_float2(0.f, 0.f);
  }
}

/// p[i] += the block's float term for C element i (rows g, g, g + 8, g + 8;
/// vectors 2q, 2q + 1, 2q, 2q + 1): qdot::dot_unit_codes' sequence on the
/// mma's int32 s.
template <class T, int NV>
__device__ __forceinline__ void add_block(const BlockRegs<T>& r, int q, float (&p)[4]) {
  int c[4] = {0, 0, 0, 0};
  detail::mma_s8_16832(c, r.a, r.b0, r.b1);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int h = i >> 1, k = i & 1;
    if (2 * q + k >= NV) continue;
    int s = c[i];
    if constexpr (T::kOffset != 0) s -= T::kOffset * int(r.ds[k].y);
    float t = qblk::mul_rn(r.scale[h], float(s));
    if constexpr (T::kHasMin) t = fmaf(r.mn[h], r.ds[k].y, t);
    p[i] = fmaf(r.ds[k].x, t, p[i]);
  }
}

/// The tile's shared-memory layout: 16 payload rows of `payload` bytes
/// (the row's n_blocks x kPayload, + 16 of padding), then 16 head rows of
/// `head` bytes (n_blocks x kHead + 16).
struct TileLayout {
  int payload, head;
  __host__ __device__ int bytes() const { return kTileRows * (payload + head); }
};
template <class T>
__host__ __device__ TileLayout tile_layout(int n_blocks) {
  return {n_blocks * SplitOf<T>::kPayload + 16, n_blocks * SplitOf<T>::kHead + 16};
}

/// Copies n 16-byte pieces from src to dst, thread t taking pieces t,
/// t + 128, ...: consecutive threads, consecutive bytes.
__device__ __forceinline__ void copy_row(uint32_t dst, const uint8_t* src, int n) {
  for (int c = int(threadIdx.x); c < n; c += kWarps * 32) detail::cp_async16(dst + 16 * c, src + 16 * c, 16);
}

template <class T, int NV, int U>
__device__ __forceinline__ void mma_cta(const uint8_t* __restrict__ w, int64_t rows, int n_blocks, XQuant xq,
                                        int64_t cols, float* __restrict__ y, bool accumulate, int64_t cta) {
  extern __shared__ __align__(16) uint8_t tile[];
  __shared__ float subtree[kWarps][32][4];
  const int64_t r0 = cta * kTileRows;
  if (r0 >= rows) return;  // the whole CTA: pdl.cuh lets CTAs with no work leave first
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const TileLayout lay = tile_layout<T>(n_blocks);
  uint8_t* const heads = tile + kTileRows * lay.payload;
  // The weights do not depend on the kernels before (pdl.cuh): they travel
  // while those drain. Rows past the end copy the last row; their sums are
  // not written.
  for (int rr = 0; rr < kTileRows; ++rr) {
    const int64_t r = min(r0 + rr, rows - 1);
    const SplitPtr<T> src = qsplit::split_block<T>(w, rows, r, 0, n_blocks);
    copy_row(detail::smem_u32(tile + rr * lay.payload), src.payload, n_blocks * SplitOf<T>::kPayload / 16);
    copy_row(detail::smem_u32(heads + rr * lay.head), src.head, n_blocks * SplitOf<T>::kHead / 16);
  }
  detail::cp_async_commit();
  pdl::begin();
  detail::cp_async_wait<0>();
  __syncthreads();
  SplitPtr<T> row[2];  // rows g and g + 8 of the tile, block 0, in shared memory
#pragma unroll
  for (int h = 0; h < 2; ++h) row[h] = {heads + (g + 8 * h) * lay.head, tile + (g + 8 * h) * lay.payload};

  // The warp's 8 slots in the order m = 8 warp + k, folded as the butterfly's
  // tree: lvl0 holds the pending slot, lvl1 a pair, lvl2 a quad.
  float lvl0[4] = {}, lvl1[4] = {}, lvl2[4] = {}, sub[4] = {};
#pragma unroll 1
  for (int k = 0; k < kSlotsPerWarp; ++k) {
    const int l = bitrev5(kSlotsPerWarp * warp + k);
    float p[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 1
    for (int b0 = l; b0 < n_blocks; b0 += 32 * U) {
      BlockRegs<T> r[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (b0 + 32 * u < n_blocks) load_block<T, NV>(row, b0 + 32 * u, xq, cols, n_blocks, g, q, r[u]);
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (b0 + 32 * u < n_blocks) add_block<T, NV>(r[u], q, p);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if ((k & 1) == 0) {
        lvl0[i] = p[i];
      } else {
        const float pair = lvl0[i] + p[i];
        if ((k & 2) == 0) {
          lvl1[i] = pair;
        } else {
          const float quad = lvl1[i] + pair;
          if ((k & 4) == 0) lvl2[i] = quad;
          else sub[i] = lvl2[i] + quad;
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) subtree[warp][lane][i] = sub[i];
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = r0 + g + 8 * (i >> 1);
    const int v = 2 * q + (i & 1);
    if (r >= rows || v >= NV) continue;
    const float total = (subtree[0][lane][i] + subtree[1][lane][i]) + (subtree[2][lane][i] + subtree[3][lane][i]);
    float* out = y + int64_t(v) * rows + r;
    *out = accumulate ? *out + total : total;
  }
}

template <class T, int NV, int U>
__global__ void __launch_bounds__(kWarps * 32)
    mma_matvec_kernel(const uint8_t* __restrict__ w, int64_t rows, int n_blocks, XQuant xq, int64_t cols,
                      float* __restrict__ y, bool accumulate) {
  mma_cta<T, NV, U>(w, rows, n_blocks, xq, cols, y, accumulate, blockIdx.x);
}

template <class T, int NV, int U>
__global__ void __launch_bounds__(kWarps * 32)
    mma_matvec_group_kernel(mvkern::GroupArgs g, int n_blocks, XQuant xq, int64_t cols) {
  const mvkern::GroupPart m = mvkern::group_part(g);
  mma_cta<T, NV, U>(m.w, m.rows, n_blocks, xq, cols, m.y, false, m.cta);
}

/// Blocks of a slot loaded together: 4 where a slot has at most 4, else 8
/// (tile_fits caps a slot at 8; a 5120-column row has 5 a slot).
template <class F>
void with_blocks_per_slot(int n_blocks, F&& f) {
  const int per_slot = (n_blocks + 31) / 32;
  if (per_slot > 4 && per_slot <= 8) return f(std::integral_constant<int, 8>{});
  f(std::integral_constant<int, 4>{});
}

/// Whether a tile of w fits the kernel: at most 256 blocks a row, payload
/// and heads whole 16-byte pieces (so that cp.async copies them).
template <class T>
bool tile_fits(int64_t cols) {
  const int64_t n_blocks = cols / T::kElems;
  return n_blocks <= 256 && (n_blocks * SplitOf<T>::kPayload) % 16 == 0 && (n_blocks * SplitOf<T>::kHead) % 16 == 0;
}

/// Raises kernel's dynamic shared memory limit to the largest tile (256
/// blocks), once per device and instantiation: the OncePerDevice is a
/// static of this function's instantiation for <T, NV, U, kGroup>, one per
/// kernel (at 59fad80 it was one per kernel *type*, shared by every
/// instantiation of a signature, so only the first launched kernel got the
/// limit and tiles over 48 KiB failed: "invalid argument").
template <class T, int NV, int U, bool kGroup, class K>
void allow_tiles(K kernel) {
  static OncePerDevice done;
  done([&] {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, tile_layout<T>(256).bytes()),
               "matvec (mma): shared memory limit");
  });
}

/// Calls f(T{}, NV, U) for w's type, n_vec and blocks a slot, where reads(w, n_vec).
template <class F>
bool dispatch(const DeviceMatrix& w, int n_vec, F&& f) {
  if (!reads(w, n_vec)) return false;
  qblk::dispatch_block_type(w.type, [&](auto traits) {
    using T = decltype(traits);
    if constexpr (kReads<T>) {
      mvkern::with_nv(n_vec, [&](auto nv) {
        if constexpr (decltype(nv)::value >= 2)  // one vector never comes here: no kernel for it
          with_blocks_per_slot(int(w.cols / T::kElems), [&](auto u) { f(traits, nv, u); });
      });
    }
  });
  return true;
}

int64_t tiles(int64_t rows) { return (rows + kTileRows - 1) / kTileRows; }

/// kernel over `grid` CTAs with the shared memory of a tile of n_blocks a row.
template <class T, int NV, int U, bool kGroup, class K, class... Args>
void launch_tiles(const char* what, K kernel, int64_t grid, int n_blocks, cudaStream_t stream, Args&&... args) {
  allow_tiles<T, NV, U, kGroup>(kernel);
  pdl::launch(what, kernel, unsigned(grid), kWarps * 32, size_t(tile_layout<T>(n_blocks).bytes()), stream,
              std::forward<Args>(args)...);
}

}  // namespace

bool reads(const DeviceMatrix& w, int n_vec) {
  if (n_vec < 2 || n_vec > kMaxMatvecVectors || !mvhost::mma_matvec() || w.layout != WeightLayout::Split) return false;
  bool fits = false;
  qblk::dispatch_block_type(w.type, [&](auto traits) {
    using T = decltype(traits);
    if constexpr (kReads<T>) fits = tile_fits<T>(w.cols);
  });
  return fits;
}

bool run(const DeviceMatrix& w, const XQuant& xq, int n_vec, float* y, bool accumulate, cudaStream_t stream) {
  return dispatch(w, n_vec, [&](auto t, auto nv, auto u) {
    using T = decltype(t);
    constexpr int NV = decltype(nv)::value, U = decltype(u)::value;
    const int n_blocks = int(w.cols / T::kElems);
    launch_tiles<T, NV, U, false>("matvec (mma) kernel launch", mma_matvec_kernel<T, NV, U>, tiles(w.rows), n_blocks,
                                  stream, static_cast<const uint8_t*>(w.data), w.rows, n_blocks, xq, w.cols, y,
                                  accumulate);
  });
}

bool run_group(const mvkern::GroupArgs& g, const DeviceMatrix& w0, const XQuant& xq, int n_vec,
               cudaStream_t stream) {
  mvkern::GroupArgs tiled = g;  // the same matrices, a CTA per tile of 16 rows
  int64_t end = 0;
  for (int i = 0; i < g.n; ++i) {
    end += tiles(g.rows[i]);
    if (end > int64_t(INT32_MAX)) throw InvalidArgument("matvec group: too many rows for one launch");
    tiled.cta_end[i] = uint32_t(end);
  }
  return dispatch(w0, n_vec, [&](auto t, auto nv, auto u) {
    using T = decltype(t);
    constexpr int NV = decltype(nv)::value, U = decltype(u)::value;
    const int n_blocks = int(w0.cols / T::kElems);
    launch_tiles<T, NV, U, true>("matvec group (mma) kernel launch", mma_matvec_group_kernel<T, NV, U>, end,
                                 n_blocks, stream, tiled, n_blocks, xq, w0.cols);
  });
}

}  // namespace activekv::cuda::mmamv
