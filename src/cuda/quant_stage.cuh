// Internal to the CUDA backend: the staged block-type matvec (quant_matvec.cu)
// -- its geometry and the reading of one tile out of a shared-memory stage --
// as __host__ __device__ code, so that the CPU emulation
// (tests/cuda/matvec_emulation.h) runs what each lane runs.
//
// Why this kernel: the profile of the chunked kernel (a warp per row, a lane
// per 32-element block decoded from shared memory) on the H200 showed it
// instruction-bound, not memory-bound: Q4_0 17408x5120 at 45 % of DRAM
// bandwidth with the schedulers issuing 73 % of cycles (bench/gpu/
// profile_kernels.sh). The tiled kernel decodes a 256-element tile from
// registers with about a third of the instructions, but loads it straight
// from global memory with lanes 144+ bytes apart, which measured slower
// still. The staged kernel takes both halves that work: a warp copies a run
// of 32 consecutive tiles (contiguous bytes, coalesced 16-byte cp.async)
// into a shared-memory ring, and each lane then reads its tile out of the
// stage into registers and decodes it with the tiled kernel's tile_dot.
//
// Work split: a warp takes R whole rows (rows_per_warp), so its tiles are
// the R * tiles consecutive tiles of those rows, 32 per chunk; the last
// chunk may leave lanes idle. Each tile's dot goes to a per-warp partial
// slot; when the rows are done, lane r sums row r's partials in tile order
// (p_0 + p_1 + ...): the result does not depend on R, warps or stages,
// only on the tile order. Deterministic, no atomics.
#pragma once

#include <cstdint>
#include <cstring>

#include "quant_tile.cuh"

namespace activekv::cuda::qstage {

using namespace qblk;
using qtile::TileOf;

inline constexpr int kChunkTiles = 32;  // one tile per lane per chunk
inline constexpr int kWarps = 4;        // warps per CTA (no CTA-wide barriers: each warp is independent)
inline constexpr int kStages = 3;       // chunks in flight per warp
/// Partial floats per warp (R * tiles * n_vec) at most: 4 KiB of shared memory.
inline constexpr int kMaxPartials = 1024;
/// Warps the grid should have before R grows (a few per SM of an H200's 132).
inline constexpr int64_t kMinWarps = 1024;

/// Bytes of one stage: 32 tiles that start anywhere in their first granule,
/// and one word of slack for the unaligned word reads at the end.
template <class T>
AKV_QHD constexpr int stage_bytes() {
  return (kChunkTiles * TileOf<T>::kBytes + 15 + 16 + 4 + 15) / 16 * 16;
}

/// Dynamic shared memory of one CTA (its upper bound, whatever R and n_vec).
template <class T>
AKV_QHD constexpr int cta_smem_bytes() {
  return kWarps * (kStages * stage_bytes<T>() + kMaxPartials * 4);
}

/// Rows per warp R for a matrix of `rows` x `tiles` tiles and n_vec vectors:
/// the R in 1..8 whose chunks leave the fewest lanes idle, among those that
/// keep >= kMinWarps warps (R = 1 when none does) and whose partials fit.
AKV_QHD int rows_per_warp(int64_t rows, int tiles, int n_vec) {
  int best = 1;
  int64_t best_idle = (kChunkTiles - tiles % kChunkTiles) % kChunkTiles;  // idle lanes per R rows, scaled below
  for (int r = 2; r <= 8; ++r) {
    if (int64_t(r) * tiles * n_vec > kMaxPartials || rows / r < kMinWarps) break;
    const int64_t items = int64_t(r) * tiles;
    const int64_t idle = (kChunkTiles - items % kChunkTiles) % kChunkTiles;
    // Compare idle lanes per tile of work: idle / items < best_idle / best_items.
    if (idle * (int64_t(best) * tiles) < best_idle * items) best = r, best_idle = idle;
  }
  return best;
}

/// Byte offset (in the matrix) of tile i of a warp whose first row is row0.
AKV_QHD int64_t tile_offset(int64_t row0, int64_t i, int tiles, int64_t row_bytes, int tile_bytes) {
  const int64_t r = i / tiles;
  return (row0 + r) * row_bytes + (i - r * tiles) * tile_bytes;
}

/// End (exclusive) of tile i's bytes: the row's end for its last tile (which
/// may be partial: a 32-element type's row need not be whole tiles).
AKV_QHD int64_t tile_end(int64_t row0, int64_t i, int tiles, int64_t row_bytes, int tile_bytes) {
  const int64_t r = i / tiles, t = i - r * tiles;
  return t == tiles - 1 ? (row0 + r + 1) * row_bytes : (row0 + r) * row_bytes + (t + 1) * tile_bytes;
}

/// A tile's words from a stage at byte offset `o` (even; 4-byte aligned
/// stage). kAligned: o % 16 == 0, read as 16-byte words. Otherwise 4-byte
/// reads at o & ~3 shifted into place by (o & 3) bytes.
template <class T, bool kAligned>
AKV_QHD void read_tile(const uint8_t* stage, int o, Words<TileOf<T>::kWords>& t) {
  using Ti = TileOf<T>;
  if constexpr (kAligned) {
    static_assert(Ti::kBytes % 16 == 0, "aligned tiles are whole granules");
    AKV_UNROLL
    for (int k = 0; k < Ti::kBytes / 16; ++k) {
      uint4 v;
#ifdef __CUDA_ARCH__
      v = *reinterpret_cast<const uint4*>(stage + o + 16 * k);
#else
      std::memcpy(&v, stage + o + 16 * k, 16);
#endif
      t.w[4 * k] = v.x, t.w[4 * k + 1] = v.y, t.w[4 * k + 2] = v.z, t.w[4 * k + 3] = v.w;
    }
  } else {
    const uint8_t* p = stage + (o & ~3);
    const int s = o & 3;
    uint32_t prev;
#ifdef __CUDA_ARCH__
    prev = *reinterpret_cast<const uint32_t*>(p);
#else
    std::memcpy(&prev, p, 4);
#endif
    AKV_UNROLL
    for (int k = 0; k < Ti::kWords; ++k) {
      uint32_t next;
#ifdef __CUDA_ARCH__
      next = *reinterpret_cast<const uint32_t*>(p + 4 * (k + 1));
#else
      std::memcpy(&next, p + 4 * (k + 1), 4);
#endif
      t.w[k] = funnel_bytes(prev, next, s);
      prev = next;
    }
  }
}

}  // namespace activekv::cuda::qstage
