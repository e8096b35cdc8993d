// Decode matvec on weights in their GGUF types (quant_matvec.h).
//
// Block types, chunked kernel (the default): a warp takes R rows (2 for one
// vector on tall 4-bit matrices, else 1) and streams them through shared
// memory in chunks of whole blocks with cp.async; each lane takes work items
// (32-element units) of the chunk, loads their int8 x once and dots it with
// each row's block (quant_dot.cuh). Each row's sum is the same whatever R.
//
// Block types, tiled kernel (kept for A/B measurements: set_block_matvec_kernel;
// quant_tile.cuh): a thread takes a 256-element tile of a row (8 blocks, or
// one K-quant super-block), reads all of its bytes into registers with
// 16-byte loads first, then decodes it and dots it with the int8 activations
// (__dp4a). A CTA holds R whole rows; its threads take the R rows' tiles in
// order; the rows are reduced with warp shuffles and then across the CTA's
// warps in shared memory, in a fixed order.
//
// Both are deterministic (no atomics) and both are emulated bit for bit on
// the CPU (tests/cuda/matvec_emulation.h).
//
// Float types: one warp per row, 16-byte loads straight from global, fp32 FMA.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "activekv/core/error.h"
#include "activekv/cuda/quant_matvec.h"
#include "quant_dot.cuh"
#include "quant_tile.cuh"
#include "quant_x.cuh"
#include "quant_split.cuh"
#include "register_matvec.h"
#include "matvec_host.h"
#include "matvec_kernel_util.cuh"
#include "model_ops_kernels.h"
#include "once_per_device.h"
#include "pdl.cuh"

namespace activekv::cuda {

namespace {

constexpr int kWarps = mvhost::kWarpsPerCta;
constexpr int kStages = 4;   // chunks in flight per warp

using qx::align256;
using mvhost::check_matvec_args;
using mvhost::check_nvec;
using mvhost::chunked_rows_per_warp;
using mvhost::is_float_type;
using mvhost::shape_str;
using mvkern::GroupArgs;
using mvkern::group_part;
using mvkern::with_nv;
using mvkern::with_rows;
using mvkern::write_row;

// ---- activation quantisation ---------------------------------------------------

using qdot::XQuant;

using qx::xquant_of;

/// One warp per 32-element block of x (blockIdx/threads cover n_vec * cols/32 blocks).
__global__ void quantize_x_kernel(const float* __restrict__ x, int64_t n_blocks, int8_t* __restrict__ qx,
                                  float2* __restrict__ ds) {
  pdl::begin();
  const int64_t blk = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (blk >= n_blocks) return;  // whole warps exit together (blockDim is a multiple of 32)
  const int lane = threadIdx.x & 31;
  const float v[1] = {x[blk * 32 + lane]};
  qx::quantize_block<1>(v, 0xffffffffu, lane, qx + blk * 32, ds + blk);
}

// ---- block-type matvec -------------------------------------------------------------

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

/// Chunks in flight per warp: with R rows a stage holds R rows' chunks.
template <int R> __host__ __device__ constexpr int chunk_stages() { return R == 1 ? kStages : 3; }

/// A warp takes rows [w * R, + R): chunk ch of each of them (64 work items,
/// quant_dot.cuh) streams through the warp's ring; lane l takes items l and
/// l + 32 of every chunk, loading each item's x once for the R rows (x is
/// read through L1 by every warp: at R = 1 it is most of the kernel's L1
/// traffic). Each row's accumulation is the R = 1 one. This is the body for
/// CTA `cta` of one matrix: blockIdx.x in the single-matrix kernel, the CTA's
/// index within its matrix in the grouped one -- the same per-row code.
template <class T, int NV, int R>
__device__ __forceinline__ void chunked_cta(const uint8_t* __restrict__ w, int64_t rows, int64_t row_bytes,
                                            int n_blocks, XQuant xq, int64_t cols, float* __restrict__ y,
                                            bool accumulate, int64_t cta) {
  using Tl = qdot::Tiling<T>;
  constexpr int NS = chunk_stages<R>();
  extern __shared__ uint4 smem_u4[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row0 = (cta * kWarps + warp) * R;
  if (row0 >= rows) return;  // no block-wide barriers below: a warp may leave
  const int n_rows = int(min(int64_t(R), rows - row0));
  uint8_t* stages = reinterpret_cast<uint8_t*>(smem_u4) + warp * NS * R * Tl::kStageBytes;
  const int64_t total = rows * row_bytes;
  const int n_chunks = (n_blocks + Tl::kChunkBlocks - 1) / Tl::kChunkBlocks;

  // Copies chunk `ch` of the rows into its stage (one commit group per call,
  // empty past the last chunk so the wait counts stay uniform).
  auto issue = [&](int ch) {
    if (ch < n_chunks) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r >= n_rows) break;
        const int64_t a = (row0 + r) * row_bytes + int64_t(ch) * Tl::kChunkBytes;
        const int64_t b = a + int64_t(min(Tl::kChunkBlocks, n_blocks - ch * Tl::kChunkBlocks)) * T::kBytes;
        const int64_t g0 = a & ~int64_t(15);
        const int n_gran = int((b - g0 + 15) >> 4);
        // 32-bit bookkeeping per granule (the 64-bit form cost ~20 instructions
        // each): bytes left in the matrix from this lane's granule on.
        const int left = int(min(total - g0, int64_t(1) << 30)) - 16 * lane;
        const uint8_t* src = w + g0 + 16 * lane;
        uint8_t* dst = stages + ((ch % NS) * R + r) * Tl::kStageBytes + 16 * lane;
        for (int i = lane; i < n_gran; i += 32, src += 512, dst += 512) {
          cp_async16(dst, src, min(16, left - 16 * (i - lane)));  // past the matrix: zero-filled
        }
      }
    }
    cp_async_commit();
  };

  float acc[R * NV];
#pragma unroll
  for (int k = 0; k < R * NV; ++k) acc[k] = 0.f;
#pragma unroll
  for (int s = 0; s < NS - 1; ++s) issue(s);  // weights only: before the wait for x (pdl.cuh)
  pdl::begin();
  for (int ch = 0; ch < n_chunks; ++ch) {
    issue(ch + NS - 1);
    cp_async_wait<NS - 1>();
    __syncwarp();
    const uint8_t* base[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t a = (row0 + r) * row_bytes + int64_t(ch) * Tl::kChunkBytes;
      base[r] = stages + ((ch % NS) * R + r) * Tl::kStageBytes + (a & 15);
    }
    const int blk0 = ch * Tl::kChunkBlocks;
    const int n_items = min(Tl::kChunkBlocks, n_blocks - blk0) * Tl::kItemsPerBlock;
#pragma unroll
    for (int k = 0; k < Tl::kItemsPerChunk / 32; ++k) {
      const int item = lane + 32 * k;
      if (item < n_items) qdot::dot_item<T, NV, R>(base, item, blk0, xq, cols, acc, n_rows);
    }
    __syncwarp();  // the stage is refilled by the next iteration's issue
  }
  cp_async_wait<0>();  // nothing may be in flight into shared memory at exit
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (r < n_rows) write_row<NV>(acc + r * NV, y, rows, row0 + r, accumulate);
}

template <class T, int NV, int R>
__global__ void __launch_bounds__(kWarps * 32)
    matvec_blocks_kernel(const uint8_t* __restrict__ w, int64_t rows, int64_t row_bytes, int n_blocks,
                         XQuant xq, int64_t cols, float* __restrict__ y, bool accumulate) {
  chunked_cta<T, NV, R>(w, rows, row_bytes, n_blocks, xq, cols, y, accumulate, blockIdx.x);
}

/// One launch over several matrices of one type and cols: each CTA runs the
/// single-matrix kernel's code on its own matrix.
template <class T, int NV, int R>
__global__ void __launch_bounds__(kWarps * 32)
    matvec_blocks_group_kernel(GroupArgs g, int64_t row_bytes, int n_blocks, XQuant xq, int64_t cols) {
  const mvkern::GroupPart m = group_part(g);
  chunked_cta<T, NV, R>(m.w, m.rows, row_bytes, n_blocks, xq, cols, m.y, false, m.cta);
}

// ---- block-type matvec, tiled ------------------------------------------------------

/// Rows [blockIdx.x * R, + R) of y; thread j takes items j, j + blockDim, ...
/// of the R rows' tiles (item i: row i / tiles, tile i % tiles).
template <class T, int NV, bool kAligned>
__global__ void __launch_bounds__(qtile::kMaxWarps * 32)
    matvec_tiled_kernel(const uint8_t* __restrict__ w, int64_t rows, int64_t row_bytes, int tiles, int rows_per_cta,
                        XQuant xq, int64_t cols, float* __restrict__ y, bool accumulate) {
  constexpr int kR = qtile::max_rows_per_cta(NV);
  using Ti = qtile::TileOf<T>;
  __shared__ float red[qtile::kMaxWarps][kR][NV];
  const int64_t row0 = int64_t(blockIdx.x) * rows_per_cta;
  const int n_rows = int(min(int64_t(rows_per_cta), rows - row0));
  const int n_items = n_rows * tiles;
  const int64_t total = rows * row_bytes;
  float acc[kR][NV];
#pragma unroll
  for (int r = 0; r < kR; ++r)
#pragma unroll
    for (int v = 0; v < NV; ++v) acc[r][v] = 0.f;

  for (int i = threadIdx.x; i < n_items; i += blockDim.x) {
    const int r = i / tiles, t = i - r * tiles;
    qblk::Words<Ti::kWords> tw;
    qtile::load_tile<T, kAligned>(w, (row0 + r) * row_bytes + int64_t(t) * Ti::kBytes, total, tw);
    float part[NV];
#pragma unroll
    for (int v = 0; v < NV; ++v) part[v] = 0.f;
    qtile::tile_dot<T, NV>(tw, t, kAligned ? qtile::kTileUnits : qtile::tile_units(t, cols), xq, cols, part);
#pragma unroll
    for (int rr = 0; rr < kR; ++rr)
      if (rr == r) {
#pragma unroll
        for (int v = 0; v < NV; ++v) acc[rr][v] += part[v];
      }
  }

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int rr = 0; rr < kR; ++rr) {
    if (rr >= n_rows) break;  // uniform over the CTA
#pragma unroll
    for (int v = 0; v < NV; ++v) {
      float a = acc[rr][v];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
      if (lane == 0) red[warp][rr][v] = a;
    }
  }
  __syncthreads();
  if (int(threadIdx.x) < n_rows * NV) {
    const int rr = threadIdx.x / NV, v = threadIdx.x % NV;
    const int n_warps = blockDim.x >> 5;
    float sum = red[0][rr][v];
    for (int k = 1; k < n_warps; ++k) sum += red[k][rr][v];
    float* p = y + v * rows + row0 + rr;
    *p = accumulate ? *p + sum : sum;
  }
}

// ---- float-type matvec ---------------------------------------------------------

template <class T, int NV>
__device__ __forceinline__ void float_cta(const uint8_t* __restrict__ w, int64_t rows, int64_t row_bytes,
                                          int64_t cols, const float* __restrict__ x, float* __restrict__ y,
                                          bool accumulate, int64_t cta) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row = cta * kWarps + warp;
  if (row >= rows) return;
  const uint8_t* wr = w + row * row_bytes;
  float acc[NV];
#pragma unroll
  for (int v = 0; v < NV; ++v) acc[v] = 0.f;
#pragma unroll 4
  for (int64_t e = 8 * lane; e < cols; e += 256) {
    float wv[8];
    T::decode8(wr, e, wv);
#pragma unroll
    for (int v = 0; v < NV; ++v) {
      const float4* xp = reinterpret_cast<const float4*>(x + v * cols + e);
      const float4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
      const float xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[v] = fmaf(wv[k], xs[k], acc[v]);
    }
  }
  write_row<NV>(acc, y, rows, row, accumulate);
}

template <class T, int NV>
__global__ void __launch_bounds__(kWarps * 32)
    matvec_float_kernel(const uint8_t* __restrict__ w, int64_t rows, int64_t row_bytes, int64_t cols,
                        const float* __restrict__ x, float* __restrict__ y, bool accumulate) {
  float_cta<T, NV>(w, rows, row_bytes, cols, x, y, accumulate, blockIdx.x);
}

template <class T, int NV>
__global__ void __launch_bounds__(kWarps * 32)
    matvec_float_group_kernel(GroupArgs g, int64_t row_bytes, int64_t cols, const float* __restrict__ x) {
  const mvkern::GroupPart m = group_part(g);
  float_cta<T, NV>(m.w, m.rows, row_bytes, cols, x, m.y, false, m.cta);
}

// ---- block-type matvec with fp32 activations --------------------------------------

// The CPU path's arithmetic (dequantised weights times fp32 x, fp32 FMA): no
// activation rounding, for comparisons with the CPU reference. One warp per
// row, each lane 4 elements at a time straight from global (weights decoded by
// dequant4, bit-identical to gguf::dequantize); not tuned for bandwidth.
template <class T, int NV, bool kSplit>
__global__ void __launch_bounds__(kWarps * 32)
    matvec_blocks_f32x_kernel(const uint8_t* __restrict__ w, int64_t rows, int64_t row_bytes, int64_t cols,
                              const float* __restrict__ x, float* __restrict__ y, bool accumulate) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarps + warp;
  if (row >= rows) return;
  float acc[NV];
#pragma unroll
  for (int v = 0; v < NV; ++v) acc[v] = 0.f;
  for (int64_t e = 4 * lane; e < cols; e += 128) {
    float wv[4];
    const int in_block = int(e % T::kElems);
    qblk::dequant4<T>(qsplit::block_at<T, kSplit>(w, rows, row_bytes, row, e / T::kElems, cols / T::kElems),
                      in_block / 32, (in_block % 32) / 4, wv);
#pragma unroll
    for (int v = 0; v < NV; ++v) {
      const float4 xv = __ldg(reinterpret_cast<const float4*>(x + v * cols + e));
      acc[v] = fmaf(wv[0], xv.x, acc[v]);
      acc[v] = fmaf(wv[1], xv.y, acc[v]);
      acc[v] = fmaf(wv[2], xv.z, acc[v]);
      acc[v] = fmaf(wv[3], xv.w, acc[v]);
    }
  }
  write_row<NV>(acc, y, rows, row, accumulate);
}

// ---- host side -----------------------------------------------------------------

BlockMatvecKernel initial_kernel() {
  const char* e = std::getenv("ACTIVEKV_MATVEC_KERNEL");
  if (e != nullptr && std::strcmp(e, "tiled") == 0) return BlockMatvecKernel::Tiled;
  return BlockMatvecKernel::Chunked;
}

BlockMatvecKernel g_kernel = initial_kernel();

template <class T, int NV>
void launch_tiled(const DeviceMatrix& w, const XQuant& xq, float* y, bool accumulate, cudaStream_t stream) {
  using Ti = qtile::TileOf<T>;
  const qtile::Geometry g = qtile::tile_geometry(w.rows, w.cols, int64_t(w.row_bytes), NV, Ti::kCanAlign);
  const dim3 grid(unsigned((w.rows + g.rows_per_cta - 1) / g.rows_per_cta)), block(32 * g.warps);
  const auto* wp = static_cast<const uint8_t*>(w.data);
  if constexpr (Ti::kCanAlign) {
    if (g.aligned) {
      matvec_tiled_kernel<T, NV, true><<<grid, block, 0, stream>>>(wp, w.rows, int64_t(w.row_bytes), g.tiles,
                                                                   g.rows_per_cta, xq, w.cols, y, accumulate);
      return;
    }
  }
  matvec_tiled_kernel<T, NV, false><<<grid, block, 0, stream>>>(wp, w.rows, int64_t(w.row_bytes), g.tiles,
                                                                g.rows_per_cta, xq, w.cols, y, accumulate);
}

/// The chunked kernel's dynamic shared memory: its stages of R rows per warp.
template <class T, int R>
constexpr size_t chunked_smem() {
  return size_t(kWarps) * chunk_stages<R>() * R * qdot::Tiling<T>::kStageBytes;
}

/// Raises `kernel`'s dynamic shared memory limit to `smem` once per device
/// (over the 48 KiB default: Q8_0 at R = 2). One flag per instantiation:
/// K (the kernel's type) tells the single and grouped kernels apart.
template <class T, int NV, int R, class K>
void allow_smem(K kernel, size_t smem) {
  static OncePerDevice smem_limit_set;
  smem_limit_set([&] {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
               "cudaFuncSetAttribute(matvec kernel)");
  });
}

template <class T, int NV, int R>
void launch_chunked_r(const DeviceMatrix& w, int n_blocks, const XQuant& xq, float* y, bool accumulate,
                      cudaStream_t stream) {
  const int64_t warps = (w.rows + R - 1) / R;
  const dim3 grid(unsigned((warps + kWarps - 1) / kWarps)), block(kWarps * 32);
  constexpr size_t smem = chunked_smem<T, R>();
  allow_smem<T, NV, R>(matvec_blocks_kernel<T, NV, R>, smem);
  pdl::launch("matvec (chunked) kernel launch", matvec_blocks_kernel<T, NV, R>, grid, block, smem, stream,
              static_cast<const uint8_t*>(w.data), w.rows, int64_t(w.row_bytes), n_blocks, xq, w.cols, y, accumulate);
}

template <class T, int NV, int R>
void launch_chunked_group_r(const GroupArgs& g, unsigned ctas, const DeviceMatrix& w0, const XQuant& xq,
                            cudaStream_t stream) {
  constexpr size_t smem = chunked_smem<T, R>();
  allow_smem<T, NV, R>(matvec_blocks_group_kernel<T, NV, R>, smem);
  pdl::launch("matvec group (chunked) kernel launch", matvec_blocks_group_kernel<T, NV, R>, ctas, kWarps * 32, smem,
              stream, g, int64_t(w0.row_bytes), int(w0.cols / T::kElems), xq, w0.cols);
}

template <class T, int NV>
void launch_chunked(const DeviceMatrix& w, int n_blocks, const XQuant& xq, float* y, bool accumulate,
                    cudaStream_t stream) {
  with_rows<NV>(chunked_rows_per_warp(w.rows, NV, T::kBytes, T::kElems), [&](auto r) {
    launch_chunked_r<T, NV, decltype(r)::value>(w, n_blocks, xq, y, accumulate, stream);
  });
}

void run_matvec(const DeviceMatrix& w, const float* x, int n_vec, float* y, bool accumulate, const void* ws,
                cudaStream_t stream) {
  if (w.rows == 0) return;
  const auto* wp = static_cast<const uint8_t*>(w.data);
  const dim3 grid(unsigned((w.rows + kWarps - 1) / kWarps)), block(kWarps * 32);
  if (mvhost::reads_registers(w)) {
    regmv::run(w, xquant_of(ws, w.cols, n_vec), n_vec, y, accumulate, stream);
    check_cuda(cudaGetLastError(), "matvec (register) kernel launch");
    return;
  }
  const bool is_block = qblk::dispatch_block_type(w.type, [&](auto t) {
    using T = decltype(t);
    const XQuant xq = xquant_of(ws, w.cols, n_vec);
    const int n_blocks = int(w.cols / T::kElems);
    with_nv(n_vec, [&](auto nv) {
      constexpr int NV = decltype(nv)::value;
      if (g_kernel == BlockMatvecKernel::Tiled) {
        launch_tiled<T, NV>(w, xq, y, accumulate, stream);
      } else {
        launch_chunked<T, NV>(w, n_blocks, xq, y, accumulate, stream);
      }
    });
  });
  if (!is_block) {
    qblk::dispatch_float_type(w.type, [&](auto t) {
      using T = decltype(t);
      with_nv(n_vec, [&](auto nv) {
        matvec_float_kernel<T, decltype(nv)::value>
            <<<grid, block, 0, stream>>>(wp, w.rows, int64_t(w.row_bytes), w.cols, x, y, accumulate);
      });
    });
  }
  check_cuda(cudaGetLastError(), "matvec kernel launch");
}

}  // namespace

void set_block_matvec_kernel(BlockMatvecKernel k) { g_kernel = k; }
BlockMatvecKernel block_matvec_kernel() { return g_kernel; }

bool has_gpu_kernel(gguf::TensorType t) {
  return qblk::dispatch_block_type(t, [](auto) {}) || qblk::dispatch_float_type(t, [](auto) {});
}

void require_gpu_kernel(const std::string& tensor_name, gguf::TensorType t) {
  if (!has_gpu_kernel(t)) {
    throw InvalidArgument("tensor '" + tensor_name + "': no GPU kernel for weight type " + gguf::type_name(t) +
                          " (GPU types: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q4_K Q5_K Q6_K)");
  }
}

bool has_split_layout(gguf::TensorType t) {
  bool ok = false;
  qblk::dispatch_block_type(t, [&](auto traits) { ok = qsplit::SplitOf<decltype(traits)>::kOk; });
  return ok;
}

bool split_layout_wanted() {
  const char* e = std::getenv("ACTIVEKV_WEIGHT_LAYOUT");
  if (e == nullptr || std::strcmp(e, "split") == 0) return true;
  if (std::strcmp(e, "gguf") == 0) return false;
  throw InvalidArgument(std::string("ACTIVEKV_WEIGHT_LAYOUT is '") + e + "': use split (the default) or gguf");
}

void validate_matrix(const DeviceMatrix& w) {
  if (!has_gpu_kernel(w.type)) {
    throw InvalidArgument("no GPU kernel for weight type " + gguf::type_name(w.type) + " (" +
                          std::to_string(w.rows) + " rows x " + std::to_string(w.cols) + " cols)");
  }
  if (w.layout == WeightLayout::Split && !has_split_layout(w.type)) {
    throw InvalidArgument(shape_str(w) + ": the split layout exists for Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K only");
  }
  if (w.layout != WeightLayout::Split && w.layout != WeightLayout::Gguf) {
    throw InvalidArgument(shape_str(w) + ": unknown layout " + std::to_string(int(w.layout)));
  }
  const int64_t blk = int64_t(gguf::block_elements(w.type));
  const int64_t mult = is_float_type(w.type) ? 8 : blk;
  if (w.cols <= 0 || w.cols % mult != 0 || w.rows < 0) {
    throw InvalidArgument(shape_str(w) + ": GPU kernels need cols a positive multiple of " +
                          std::to_string(mult) + " and rows >= 0");
  }
  if (w.cols / blk > (int64_t(1) << 30)) throw InvalidArgument(shape_str(w) + ": too many columns");
  if (w.row_bytes != gguf::row_bytes(w.type, uint64_t(w.cols))) {
    throw InvalidArgument(shape_str(w) + ": row_bytes " + std::to_string(w.row_bytes) + " != " +
                          std::to_string(gguf::row_bytes(w.type, uint64_t(w.cols))));
  }
  if (w.rows > 0 && (w.data == nullptr || reinterpret_cast<uintptr_t>(w.data) % 16 != 0)) {
    throw InvalidArgument(shape_str(w) + ": device data must be non-null and 16-byte aligned");
  }
}

void launch_repack_split(const void* src_gguf, const DeviceMatrix& dst, cudaStream_t stream) {
  if (dst.layout != WeightLayout::Split) throw InvalidArgument("repack: the destination's layout must be Split");
  validate_matrix(dst);
  const size_t bytes = size_t(dst.rows) * dst.row_bytes;
  const auto* s = static_cast<const uint8_t*>(src_gguf);
  const auto* d = static_cast<const uint8_t*>(dst.data);
  if (bytes > 0 && (s == nullptr || (s < d + bytes && d < s + bytes))) {
    throw InvalidArgument("repack: the GGUF source of the " + shape_str(dst) + " is null or overlaps it");
  }
  regmv::repack(src_gguf, dst, stream);
  check_cuda(cudaGetLastError(), "repack kernel launch");
}

size_t matvec_workspace_bytes(int64_t cols, int n_vec) {
  check_nvec(n_vec);
  if (cols <= 0 || cols % 32 != 0) {
    throw InvalidArgument("matvec workspace: cols " + std::to_string(cols) + " is not a positive multiple of 32");
  }
  return align256(size_t(n_vec) * cols) + align256(size_t(n_vec) * (cols / 32) * sizeof(float2));
}

void launch_quantize_activations(const float* x, int64_t cols, int n_vec, void* workspace, cudaStream_t stream) {
  (void)matvec_workspace_bytes(cols, n_vec);  // validates cols and n_vec
  if (x == nullptr || workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 256 != 0) {
    throw InvalidArgument("quantize activations: x must be non-null, the workspace non-null and 256-byte aligned");
  }
  const int64_t n_blocks = int64_t(n_vec) * (cols / 32);
  const XQuant xq = xquant_of(workspace, cols, n_vec);
  constexpr int kThreads = 256;
  const unsigned grid = unsigned((n_blocks * 32 + kThreads - 1) / kThreads);
  pdl::launch("quantize_x_kernel launch", quantize_x_kernel, grid, kThreads, 0, stream, x, n_blocks,
              const_cast<int8_t*>(xq.qx), const_cast<float2*>(xq.ds));
}

Int8Blocks matvec_int8_blocks(void* workspace, int64_t cols, int n_vec) {
  (void)matvec_workspace_bytes(cols, n_vec);  // validates cols and n_vec
  if (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 256 != 0)
    throw InvalidArgument("matvec int8 blocks: the workspace must be non-null and 256-byte aligned");
  const XQuant xq = xquant_of(workspace, cols, n_vec);
  return {const_cast<int8_t*>(xq.qx), reinterpret_cast<float*>(const_cast<float2*>(xq.ds))};
}

void launch_rms_norm_quantize(const float* x, const float* weight, int T, int n, float eps, float* out,
                              void* workspace, cudaStream_t stream) {
  (void)matvec_workspace_bytes(n, T);  // validates n and T
  if (x == nullptr || weight == nullptr || out == nullptr || workspace == nullptr ||
      reinterpret_cast<uintptr_t>(workspace) % 256 != 0) {
    throw InvalidArgument("rms_norm_quantize: x, weight and out must be non-null, the workspace non-null and "
                          "256-byte aligned");
  }
  if (!std::isfinite(eps) || eps < 0.f) {
    throw InvalidArgument("rms_norm_quantize: eps must be finite and >= 0, got " + std::to_string(eps));
  }
  if (kernels::rms_norm_quantize(x, weight, T, n, eps, out, workspace, stream)) return;
  kernels::rms_norm(x, weight, T, n, eps, out, stream);  // unaligned rows: the same bits in two launches
  launch_quantize_activations(out, n, T, workspace, stream);
}

void launch_swiglu_quantize(float* gate, const float* up, int T, int n, void* workspace, cudaStream_t stream) {
  (void)matvec_workspace_bytes(n, T);  // validates n and T
  if (gate == nullptr || up == nullptr || workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 256 != 0) {
    throw InvalidArgument("swiglu_quantize: gate and up must be non-null, the workspace non-null and 256-byte aligned");
  }
  if (kernels::swiglu_quantize(gate, up, T, n, workspace, stream)) return;
  kernels::swiglu(gate, up, int64_t(T) * n, stream);  // unaligned: the same bits in two launches
  launch_quantize_activations(gate, n, T, workspace, stream);
}

void launch_matvec(const DeviceMatrix& w, const float* x, int n_vec, float* y, bool accumulate, void* workspace,
                   cudaStream_t stream) {
  check_matvec_args(w, x, true, n_vec, y, workspace);
  if (!is_float_type(w.type) && w.rows > 0) launch_quantize_activations(x, w.cols, n_vec, workspace, stream);
  run_matvec(w, x, n_vec, y, accumulate, workspace, stream);
}

void launch_matvec_f32_activations(const DeviceMatrix& w, const float* x, int n_vec, float* y, bool accumulate,
                                   cudaStream_t stream) {
  check_matvec_args(w, x, true, n_vec, y, nullptr, /*quantises_x=*/false);
  if (w.rows == 0) return;
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0)
    throw InvalidArgument("matvec on " + shape_str(w) + ": x must be 16-byte aligned");
  const auto* wp = static_cast<const uint8_t*>(w.data);
  const dim3 grid(unsigned((w.rows + kWarps - 1) / kWarps)), block(kWarps * 32);
  const bool is_block = qblk::dispatch_block_type(w.type, [&](auto t) {
    using T = decltype(t);
    with_nv(n_vec, [&](auto nv) {
      qsplit::with_layout<T>(w.layout, [&](auto split) {
        matvec_blocks_f32x_kernel<T, decltype(nv)::value, decltype(split)::value>
            <<<grid, block, 0, stream>>>(wp, w.rows, int64_t(w.row_bytes), w.cols, x, y, accumulate);
      });
    });
  });
  if (!is_block) {
    run_matvec(w, x, n_vec, y, accumulate, nullptr, stream);  // float weights: already fp32 activations
    return;
  }
  check_cuda(cudaGetLastError(), "matvec (fp32 activations) kernel launch");
}

void launch_matvec_prequantized(const DeviceMatrix& w, const float* x, int n_vec, float* y, bool accumulate,
                                const void* workspace, cudaStream_t stream) {
  check_matvec_args(w, x, is_float_type(w.type), n_vec, y, workspace);
  run_matvec(w, x, n_vec, y, accumulate, workspace, stream);
}

void launch_matvec_prequantized_group(const MatvecGroupItem* items, int n, const float* x, int n_vec,
                                      const void* workspace, cudaStream_t stream) {
  const mvhost::GroupPlan plan = mvhost::plan_group(items, n, x, n_vec, workspace, g_kernel);
  if (!plan.one_launch) {  // the tiled kernel: its row sums depend on each matrix's own CTA geometry
    for (int i = 0; i < n; ++i) run_matvec(*items[i].w, x, n_vec, items[i].y, false, workspace, stream);
    return;
  }
  if (plan.ctas() == 0) return;  // every matrix has 0 rows
  GroupArgs g{};
  g.n = n;
  for (int i = 0; i < n; ++i) {
    g.w[i] = static_cast<const uint8_t*>(items[i].w->data);
    g.y[i] = items[i].y;
    g.rows[i] = items[i].w->rows;
    g.cta_end[i] = plan.cta_end[i];
  }
  const DeviceMatrix& w0 = *items[0].w;
  if (plan.registers) {
    regmv::run_group(g, plan, w0, xquant_of(workspace, w0.cols, n_vec), n_vec, stream);
    check_cuda(cudaGetLastError(), "grouped matvec (register) kernel launch");
    return;
  }
  const bool is_block = qblk::dispatch_block_type(w0.type, [&](auto t) {
    using T = decltype(t);
    const XQuant xq = xquant_of(workspace, w0.cols, n_vec);
    with_nv(n_vec, [&](auto nv) {
      constexpr int NV = decltype(nv)::value;
      with_rows<NV>(plan.rows_per_warp,
                    [&](auto r) { launch_chunked_group_r<T, NV, decltype(r)::value>(g, plan.ctas(), w0, xq, stream); });
    });
  });
  if (!is_block) {
    qblk::dispatch_float_type(w0.type, [&](auto t) {
      with_nv(n_vec, [&](auto nv) {
        matvec_float_group_kernel<decltype(t), decltype(nv)::value>
            <<<plan.ctas(), kWarps * 32, 0, stream>>>(g, int64_t(w0.row_bytes), w0.cols, x);
      });
    });
  }
  check_cuda(cudaGetLastError(), "grouped matvec kernel launch");
}

}  // namespace activekv::cuda
