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
// order m = bitrev5(l) is the plain balanced tree over m. So each of a
// CTA's 8 warps takes 4 consecutive m (a subtree of 4 slots) and the CTA
// adds the 8 subtrees as the tree's top three levels. Float addition is
// commutative, so only the tree's shape matters. Rows and vectors are independent in the
// mma, so a row's bits do not depend on how many vectors ride along.
//
// How the weights arrive (third version): a persistent CTA of 8 warps per
// SM walks its tiles of 16 rows in pieces of 64 blocks (each lane slot's
// next two blocks), copied into a ring of S pieces in shared memory by
// coalesced cp.async (consecutive threads, consecutive 16 bytes), S - 1
// pieces ahead, one CTA barrier a piece; x (codes and {d, sum q} of every
// vector) is copied into shared memory once per CTA. Rows of a piece are
// padded by 16 bytes so that the 32 lanes' fragment reads fall in distinct
// banks (x's rows too). A warp owns 4 slots (m = 4 warp + k) and keeps their
// sums across the tile's pieces; at the tile's end it folds them ((s0 + s1)
// + (s2 + s3)) and the CTA adds the 8 subtrees as the balanced tree.
// Measured before it (bench/results/h200_matvec_mma_*.json): loading
// fragments straight from global memory (56dcf9f) touched 8 lines for 128
// useful bytes a warp load, 1.9-9.7x slower than the register kernel; a CTA
// per tile with the whole tile staged and then computed (24c8263) left each
// SM with nothing in flight while it computed and re-read x from L1/L2 per
// tile: 1.3-4.9x slower. This one, once its copies and scales were made
// cheap (4247b23), runs at 0.75-0.90x the register kernel's time at 8
// vectors and still loses at 2 and 4 (mvhost::mma_for says when it runs).
// A tile's row must be at most 256 blocks (8192 columns: x and S >= 4
// pieces fit the shared memory), payload and heads whole 16-byte pieces;
// other matrices keep the register kernel.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
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

constexpr int kWarps = 8;  // a CTA: 8 warps, 4 of the 32 lane slots each
constexpr int kThreads = 32 * kWarps;
constexpr int kTileRows = 16;
constexpr int kSlotsPerWarp = 32 / kWarps;
constexpr int kBlocksPerSlot = 2;                 // a slot's blocks in one piece
constexpr int kPieceBlocks = 32 * kBlocksPerSlot;  // a piece: 64 blocks of the tile's 16 rows
constexpr int kMaxBlocks = 256;                    // a row: at most 8192 columns

/// The 32-element split types whose codes are bytes < 0x80 or signed bytes
/// (T::raw4): Q4_0, Q4_1, Q8_0 (Q5_0's fifth bits later).
template <class T>
constexpr bool kReads = SplitOf<T>::kOk && T::kUnits == 1 && T::kType != gguf::TensorType::Q5_0;

__device__ __forceinline__ int bitrev5(int m) { return int(__brev(uint32_t(m)) >> 27); }

/// A piece in shared memory: 16 payload rows of kPayRow bytes (64 blocks'
/// payloads + 16 of padding), then 16 head rows of kHeadRow bytes.
template <class T>
struct Piece {
  static constexpr int kPayRow = kPieceBlocks * SplitOf<T>::kPayload + 16;
  static constexpr int kHeadRow = kPieceBlocks * SplitOf<T>::kHead + 16;
  static constexpr int kBytes = kTileRows * (kPayRow + kHeadRow);
};

/// The CTA's dynamic shared memory: the warps' subtree sums, x's {d, sum q}
/// (NV rows of n_blocks + 2 float2), x's codes (NV rows of 32 n_blocks + 16
/// bytes), then the ring of S pieces. Every part starts 16-byte aligned
/// (tile_fits: n_blocks is a multiple of 8, or of 4 for Q4_1, whose 4-byte
/// heads make whole 16-byte pieces at 4 blocks; the parts need it even).
struct Layout {
  int ds_row, codes_row;  // float2, bytes
  int ds, codes, ring, bytes;
};
constexpr int kSubtreeBytes = kWarps * 32 * 4 * 4;
template <class T>
__host__ __device__ Layout layout_of(int nv, int n_blocks, int stages) {
  Layout l{};
  l.ds_row = n_blocks + 2;
  l.codes_row = 32 * n_blocks + 16;
  l.ds = kSubtreeBytes;
  l.codes = l.ds + nv * l.ds_row * 8;
  l.ring = l.codes + nv * l.codes_row;
  l.bytes = l.ring + stages * Piece<T>::kBytes;
  return l;
}

/// One block of a slot: the A fragment of rows g and g + 8, their scales
/// (and mins), the B fragment of vector g, and {d, sum q} of vectors 2q,
/// 2q + 1.
template <class T>
struct BlockRegs {
  uint4 a;
  float scale[2], mn[2];
  uint32_t b0, b1;
  float2 ds[2];
};

/// The head of a block in shared memory into r.head (r.payload is not read:
/// only scale and min come from r).
template <class T>
__device__ __forceinline__ void load_head(const uint8_t* head, qsplit::SplitRegs<T>& r) {
  constexpr int kHead = SplitOf<T>::kHead;
  static_assert(kHead == 2 || kHead == 4, "Q4_0, Q8_0: f16 d; Q4_1: f16 d, f16 m");
  if constexpr (kHead == 4) r.head[0] = *reinterpret_cast<const uint32_t*>(head);
  else r.head[0] = *reinterpret_cast<const uint16_t*>(head);
}

/// Loads block bl of the piece (block b of the row) from shared memory.
template <class T, int NV>
__device__ __forceinline__ void load_block(const SplitPtr<T> (&row)[2], int bl, int b, const int8_t* codes,
                                           const float2* ds, const Layout& lay, int g, int q, BlockRegs<T>& r) {
  SplitPtr<T> blk[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    blk[h] = {row[h].head + bl * SplitOf<T>::kHead, row[h].payload + bl * SplitOf<T>::kPayload};
    // The scale (and min) from the head in registers: the hardware's f16
    // conversion, as the register kernel's (the byte-pointer source checks
    // for NaN payloads in a dozen instructions and two branches).
    qsplit::SplitRegs<T> head;
    load_head(blk[h].head, head);
    r.scale[h] = T::scale(head, 0, 0);
    r.mn[h] = 0.f;
    if constexpr (T::kHasMin) r.mn[h] = T::min(head, 0);
  }
  // a0, a1: elements 4q .. 4q + 3 of rows g, g + 8; a2, a3: elements 16 + 4q ..
  r.a = make_uint4(T::raw4(blk[0], 0, q), T::raw4(blk[1], 0, q), T::raw4(blk[0], 0, q + 4), T::raw4(blk[1], 0, q + 4));
  r.b0 = r.b1 = 0u;
  if (g < NV) {
    const int8_t* xp = codes + g * lay.codes_row + 32 * b + 4 * q;
    r.b0 = *reinterpret_cast<const uint32_t*>(xp);
    r.b1 = *reinterpret_cast<const uint32_t*>(xp + 16);
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int v = 2 * q + k;
    r.ds[k] = v < NV ? ds[v * lay.ds_row + b] : make_float2(0.f, 0.f);
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

/// Tile t of the launch (g.cta_end holds tile ends here; the host checks
/// that they fit 32 bits).
__device__ __forceinline__ mvkern::GroupPart tile_at(const mvkern::GroupArgs& g, int64_t t) {
  return mvkern::group_part_at(g, uint32_t(t));
}

/// Starts the copy of piece c (blocks 64 c ..) of tile m into buf. Thread t
/// takes the 16-byte column t % kPayCols of rows t / kPayCols, + kRowStep,
/// ... (and at most one column of the heads): consecutive threads,
/// consecutive bytes, and no division -- the copies' address arithmetic
/// was the kernel's largest cost at 513a368 (~158 instructions a copy).
/// Rows past the matrix's end copy its last row; their sums are not written.
template <class T>
__device__ __forceinline__ void copy_piece(uint8_t* buf, const mvkern::GroupPart& m, int c, int n_blocks) {
  using P = Piece<T>;
  constexpr int kPay = SplitOf<T>::kPayload, kHead = SplitOf<T>::kHead;
  constexpr int kPayCols = kPieceBlocks * kPay / 16, kRowStep = kThreads / kPayCols;
  constexpr int kHeadCols = kPieceBlocks * kHead / 16;
  static_assert(kThreads % kPayCols == 0 && kTileRows * kHeadCols <= kThreads, "a piece's copy plan");
  const int c0 = c * kPieceBlocks, nc = min(kPieceBlocks, n_blocks - c0);
  const int64_t r0 = m.cta * kTileRows;
  const int last = int(min(int64_t(kTileRows - 1), m.rows - 1 - r0));  // the tile's last row inside the matrix
  const SplitPtr<T> base = qsplit::split_block<T>(m.w, m.rows, r0, c0, n_blocks);
  const int t = int(threadIdx.x);
  const int k = t % kPayCols;
  if (16 * k < nc * kPay) {
    const int64_t row_bytes = int64_t(n_blocks) * kPay;
    const int rr0 = t / kPayCols;  // < kRowStep: the CTA has kThreads threads
    const uint32_t dst = detail::smem_u32(buf + rr0 * P::kPayRow + 16 * k);
    const uint8_t* const src = base.payload + 16 * k;
#pragma unroll
    for (int j = 0; j < kTileRows / kRowStep; ++j) {
      const int rr = rr0 + j * kRowStep;
      detail::cp_async16(dst + j * kRowStep * P::kPayRow, src + min(rr, last) * row_bytes, 16);
    }
  }
  const int hk = t % kHeadCols, hr = t / kHeadCols;
  if (hr < kTileRows && 16 * hk < nc * kHead)
    detail::cp_async16(detail::smem_u32(buf + kTileRows * P::kPayRow + hr * P::kHeadRow + 16 * hk),
                       base.head + min(hr, last) * (int64_t(n_blocks) * kHead) + 16 * hk, 16);
}

/// Starts the copy of x's codes and {d, sum q} for NV vectors into shared memory.
template <int NV>
__device__ __forceinline__ void copy_x(uint8_t* smem, const Layout& lay, const XQuant& xq, int n_blocks) {
  const int codes16 = 2 * n_blocks, ds16 = n_blocks / 2;  // 16-byte pieces a vector
  for (int i = int(threadIdx.x); i < NV * codes16; i += kThreads) {
    const int v = i / codes16, k = i - v * codes16;
    detail::cp_async16(detail::smem_u32(smem + lay.codes + v * lay.codes_row + 16 * k),
                       xq.qx + int64_t(v) * 32 * n_blocks + 16 * k, 16);
  }
  for (int i = int(threadIdx.x); i < NV * ds16; i += kThreads) {
    const int v = i / ds16, k = i - v * ds16;
    detail::cp_async16(detail::smem_u32(smem + lay.ds + 8 * (v * lay.ds_row) + 16 * k),
                       xq.ds + int64_t(v) * n_blocks + 2 * k, 16);
  }
}

/// The warp's share of one piece: for each of its 4 slots the piece's (at
/// most 2) blocks of the slot, in block order, into p[slot]. kFull: the
/// piece has all 64 blocks (no checks).
template <class T, int NV, bool kFull>
__device__ __forceinline__ void compute_piece(const uint8_t* buf, int c0, int nc, const int8_t* codes,
                                              const float2* ds, const Layout& lay, int warp, int g, int q,
                                              float (&p)[kSlotsPerWarp][4]) {
  using P = Piece<T>;
  SplitPtr<T> row[2];  // rows g and g + 8 of the piece, its block 0
#pragma unroll
  for (int h = 0; h < 2; ++h) row[h] = {buf + kTileRows * P::kPayRow + (g + 8 * h) * P::kHeadRow, buf + (g + 8 * h) * P::kPayRow};
  BlockRegs<T> r[kSlotsPerWarp][kBlocksPerSlot];
#pragma unroll
  for (int k = 0; k < kSlotsPerWarp; ++k)
#pragma unroll
    for (int j = 0; j < kBlocksPerSlot; ++j) {
      const int bl = bitrev5(kSlotsPerWarp * warp + k) + 32 * j;
      if (kFull || bl < nc) load_block<T, NV>(row, bl, c0 + bl, codes, ds, lay, g, q, r[k][j]);
    }
#pragma unroll
  for (int k = 0; k < kSlotsPerWarp; ++k)
#pragma unroll
    for (int j = 0; j < kBlocksPerSlot; ++j)
      if (kFull || bitrev5(kSlotsPerWarp * warp + k) + 32 * j < nc) add_block<T, NV>(r[k][j], q, p[k]);
}

/// The tile's end: the warp folds its 4 slots as the butterfly's tree,
/// the CTA adds the 8 subtrees ((w0 + w1) + (w2 + w3)) + ((w4 + w5) + (w6 +
/// w7)), and warp 0 writes (or adds to) y for the tile's rows and vectors.
template <int NV>
__device__ __forceinline__ void finish_tile(float (*subtree)[32][4], float (&p)[kSlotsPerWarp][4],
                                            const mvkern::GroupPart& m, bool accumulate, int warp, int lane) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    subtree[warp][lane][i] = (p[0][i] + p[1][i]) + (p[2][i] + p[3][i]);
#pragma unroll
    for (int k = 0; k < kSlotsPerWarp; ++k) p[k][i] = 0.f;
  }
  __syncthreads();
  if (warp != 0) return;
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = m.cta * kTileRows + g + 8 * (i >> 1);
    const int v = 2 * q + (i & 1);
    if (r >= m.rows || v >= NV) continue;
    const float total = ((subtree[0][lane][i] + subtree[1][lane][i]) + (subtree[2][lane][i] + subtree[3][lane][i])) +
                        ((subtree[4][lane][i] + subtree[5][lane][i]) + (subtree[6][lane][i] + subtree[7][lane][i]));
    float* out = m.y + int64_t(v) * m.rows + r;
    *out = accumulate ? *out + total : total;
  }
}

/// The persistent kernel: CTA b takes tiles b, b + grid, ... of the launch
/// (n_tiles over g's matrices), their pieces in order through a ring of S.
/// The next piece's barrier keeps the subtree sums until warp 0 has read
/// them (a tile is at least one piece).
template <class T, int NV, int S>
__global__ void __launch_bounds__(kThreads, 1)
    mma_matvec_kernel(mvkern::GroupArgs g, int64_t n_tiles, int n_blocks, XQuant xq, bool accumulate) {
  extern __shared__ __align__(16) uint8_t smem[];
  const Layout lay = layout_of<T>(NV, n_blocks, S);
  auto* const subtree = reinterpret_cast<float (*)[32][4]>(smem);
  const auto* const ds = reinterpret_cast<const float2*>(smem + lay.ds);
  const auto* const codes = reinterpret_cast<const int8_t*>(smem + lay.codes);
  uint8_t* const ring = smem + lay.ring;
  const int chunks = (n_blocks + kPieceBlocks - 1) / kPieceBlocks;
  // The host launches at most n_tiles CTAs: every CTA has a tile, and calls pdl::begin.
  const int64_t n_pieces = ((n_tiles - 1 - int64_t(blockIdx.x)) / gridDim.x + 1) * chunks;
  // Pieces are (tile, chunk) in order; two cursors walk them without division.
  struct Cursor {
    int64_t tile;  // in the launch
    int chunk, buf;
    __device__ void next(int chunks, int64_t stride) {
      buf = (buf + 1) % S;
      if (++chunk == chunks) chunk = 0, tile += stride;
    }
  };
  const int64_t stride = gridDim.x;
  Cursor load{int64_t(blockIdx.x), 0, 0}, use = load;
  int64_t issued = 0;
  auto issue = [&] {
    if (issued++ < n_pieces) {
      copy_piece<T>(ring + load.buf * Piece<T>::kBytes, tile_at(g, load.tile), load.chunk, n_blocks);
      load.next(chunks, stride);
    }
    detail::cp_async_commit();  // empty past the end: the group count stays S - 1 ahead
  };
  // The weights do not depend on the kernels before (pdl.cuh): they travel
  // while those drain; x does, so it is copied after pdl::begin.
  for (int s = 0; s < S - 1; ++s) issue();
  pdl::begin();
  copy_x<NV>(smem, lay, xq, n_blocks);
  detail::cp_async_commit();
  detail::cp_async_wait<0>();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, q = lane & 3;
  float p[kSlotsPerWarp][4] = {};
#pragma unroll 1
  for (int64_t piece = 0; piece < n_pieces; ++piece) {
    detail::cp_async_wait<S - 2>();  // this thread's copies of `piece` have landed ...
    __syncthreads();                 // ... and everyone's; the buffer of piece - 1 is free
    issue();
    const uint8_t* buf = ring + use.buf * Piece<T>::kBytes;
    const int c0 = use.chunk * kPieceBlocks, nc = min(kPieceBlocks, n_blocks - c0);
    if (nc == kPieceBlocks) compute_piece<T, NV, true>(buf, c0, nc, codes, ds, lay, warp, gq, q, p);
    else compute_piece<T, NV, false>(buf, c0, nc, codes, ds, lay, warp, gq, q, p);
    if (use.chunk == chunks - 1) finish_tile<NV>(subtree, p, tile_at(g, use.tile), accumulate, warp, lane);
    use.next(chunks, stride);
  }
}

/// Pieces in flight: 8 where x and 8 pieces fit `smem` bytes, else 4 where
/// those fit, else 0 (the kernel does not take the matrix).
template <class T>
int stages_for(int nv, int n_blocks, int smem) {
  for (const int s : {8, 4})
    if (layout_of<T>(nv, n_blocks, s).bytes <= smem) return s;
  return 0;
}

// The 1 KiB of static shared memory the compiler gives these kernels
// (cuobjdump -res-usage: SHARED:1024): static + dynamic must fit the opt-in.
constexpr int kStaticSmem = 1024;

/// The current device's SM count and the opt-in shared memory a CTA may have.
struct DeviceLimits {
  int sms = 0, smem_optin = 0;
};
const DeviceLimits& device_limits() {
  constexpr int kDevices = 64;
  static DeviceLimits per_device[kDevices];
  static OncePerDevice once;
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "matvec (mma): cudaGetDevice");
  if (dev < 0 || dev >= kDevices) throw InvalidArgument("matvec (mma): device index past 64");
  once([&] {
    DeviceLimits l;
    check_cuda(cudaDeviceGetAttribute(&l.sms, cudaDevAttrMultiProcessorCount, dev), "matvec (mma): SM count");
    check_cuda(cudaDeviceGetAttribute(&l.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
               "matvec (mma): shared memory per CTA");
    per_device[dev] = l;
  });
  return per_device[dev];
}

std::atomic<int> g_grid_cap{0};

/// Whether w's tiles fit the kernel: at most 256 blocks a row, payload and
/// heads whole 16-byte pieces (so that cp.async copies them; then n_blocks
/// is a multiple of 8). Host only, no device asked (the CPU tests ask it).
template <class T>
bool tile_fits(int64_t cols) {
  const int64_t n_blocks = cols / T::kElems;
  return n_blocks <= kMaxBlocks && (n_blocks * SplitOf<T>::kPayload) % 16 == 0 &&
         (n_blocks * SplitOf<T>::kHead) % 16 == 0;
}

/// Raises the kernel's dynamic shared memory limit to the device's opt-in
/// maximum, once per device and instantiation (the OncePerDevice is a
/// static of this function's instantiation for <T, NV, S>: at 59fad80 it
/// was one per kernel *type*, so only the first launched kernel got the
/// limit and tiles over 48 KiB failed with "invalid argument").
template <class T, int NV, int S, class K>
void allow_smem(K kernel) {
  static OncePerDevice done;
  done([&] {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    device_limits().smem_optin - kStaticSmem),
               "matvec (mma): shared memory limit");
  });
}

/// Launches the kernel for w0's type over the tiles of g (cta_end: tile
/// ends); false where reads(w0, n_vec) is.
bool launch(const mvkern::GroupArgs& g, int64_t n_tiles, const DeviceMatrix& w0, const XQuant& xq, int n_vec,
            bool accumulate, cudaStream_t stream) {
  if (!reads(w0, n_vec)) return false;
  const DeviceLimits& dev = device_limits();
  // x and 4 pieces must fit the device's shared memory a CTA: on sm_90 (227
  // KiB) every matrix reads() takes fits; a smaller one keeps the register kernel.
  const int stages = ring_stages(w0, n_vec, dev.smem_optin);
  if (stages == 0) return false;
  const int cap = g_grid_cap.load(std::memory_order_relaxed);
  const int64_t grid = std::min<int64_t>(n_tiles, cap > 0 ? cap : dev.sms);
  qblk::dispatch_block_type(w0.type, [&](auto traits) {
    using T = decltype(traits);
    if constexpr (kReads<T>) {
      const int n_blocks = int(w0.cols / T::kElems);
      mvkern::with_nv(n_vec, [&](auto nv) {
        constexpr int NV = decltype(nv)::value;
        if constexpr (NV >= 2) {  // one vector never comes here: no kernel for it
          auto go = [&](auto s) {
            constexpr int S = decltype(s)::value;
            allow_smem<T, NV, S>(mma_matvec_kernel<T, NV, S>);
            pdl::launch("matvec (mma) kernel launch", mma_matvec_kernel<T, NV, S>, unsigned(grid), kThreads,
                        size_t(layout_of<T>(NV, n_blocks, S).bytes), stream, g, n_tiles, n_blocks, xq, accumulate);
          };
          if (stages == 8) go(std::integral_constant<int, 8>{});
          else go(std::integral_constant<int, 4>{});
        }
      });
    }
  });
  return true;
}

int64_t tiles(int64_t rows) { return (rows + kTileRows - 1) / kTileRows; }

}  // namespace

int ring_stages(const DeviceMatrix& w, int n_vec, int smem_bytes) {
  int stages = 0;
  qblk::dispatch_block_type(w.type, [&](auto traits) {
    using T = decltype(traits);
    if constexpr (kReads<T>) stages = stages_for<T>(n_vec, int(w.cols / T::kElems), smem_bytes - kStaticSmem);
  });
  return stages;
}

void set_grid_cap(int ctas) { g_grid_cap.store(std::max(0, ctas), std::memory_order_relaxed); }

bool reads(const DeviceMatrix& w, int n_vec) {
  if (n_vec < 2 || n_vec > kMaxMatvecVectors || !mvhost::mma_for(n_vec) || w.layout != WeightLayout::Split) return false;
  bool fits = false;
  qblk::dispatch_block_type(w.type, [&](auto traits) {
    using T = decltype(traits);
    if constexpr (kReads<T>) fits = tile_fits<T>(w.cols);
  });
  return fits;
}

bool run(const DeviceMatrix& w, const XQuant& xq, int n_vec, float* y, bool accumulate, cudaStream_t stream) {
  mvkern::GroupArgs one{};
  one.w[0] = static_cast<const uint8_t*>(w.data);
  one.y[0] = y;
  one.rows[0] = w.rows;
  const int64_t n_tiles = tiles(w.rows);
  if (n_tiles > int64_t(INT32_MAX)) throw InvalidArgument("matvec (mma): too many rows for one launch");
  one.cta_end[0] = uint32_t(n_tiles);
  one.n = 1;
  return launch(one, n_tiles, w, xq, n_vec, accumulate, stream);
}

bool run_group(const mvkern::GroupArgs& g, const DeviceMatrix& w0, const XQuant& xq, int n_vec,
               cudaStream_t stream) {
  mvkern::GroupArgs tiled = g;  // the same matrices, cta_end counting tiles of 16 rows
  int64_t end = 0;
  for (int i = 0; i < g.n; ++i) {
    end += tiles(g.rows[i]);
    if (end > int64_t(INT32_MAX)) throw InvalidArgument("matvec group: too many rows for one launch");
    tiled.cta_end[i] = uint32_t(end);
  }
  return launch(tiled, end, w0, xq, n_vec, false, stream);
}

}  // namespace activekv::cuda::mmamv
