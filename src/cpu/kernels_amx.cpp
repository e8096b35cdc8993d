// AMX scores for the bf16 CPU items (kernels.h): q.k on the tile unit, the
// rest (softmax, P.V) by the AVX-512 kernel's code (bf16_finish_avx512).
// Like kernels_avx512.cpp, the only TU compiled for AMX (the pragma below,
// after the includes), using no C++ library templates; decode_attention.cpp
// calls it only where cpu_has_amx_kernels().
//
// Why: the AVX-512 item spends ~96 dpbf16 per key row (G = 6 heads x 8
// chunks x 2 query terms) on q.k, which keeps a core below its share of the
// host's read bandwidth. Here the key rows of a page are the A operand as
// they lie -- 16 tokens x 32 channels of bf16, rows d * 2 bytes apart -- and
// the query the B operand: S^T (16 tokens x 16 heads) += K_chunk . Q_chunk^T,
// the query in the VNNI layout the tile unit wants (for each pair of
// channels, every head's two values side by side), built once per KV head and
// call by the caller (pack_query_amx; packed per item it took ~2 % of the
// kernels' samples in a profile: perf, dev VM, 27B shape, 8K x 8 layers,
// one thread). The query's two bf16 terms (hi + the rounding residual, as the AVX-512 kernel)
// accumulate into the same fp32 tile. Heads past G are zero columns.
//
// Two score tiles of 16 tokens each share every query tile load; a split's
// last tokens (fewer than 32) are copied into a zeroed buffer first, so no
// tile reads past the item's rows.
//
// int8s stays on the AVX-512 kernel: the same scheme with the codes
// (tdpbssd on 64-channel rows, exact int32 dots, bitwise the dpbusd scores)
// measured slower on the dev VM (3.07 against 2.61 ms per layer, 27B shape,
// 8K, one thread), where the bf16 one measured 4.64-4.74 against 5.06-5.25.
//
// The tile configuration is loaded per item (another library may have
// loaded its own) and the tiles are not released after: releasing per item
// cost ~3 % there; the OpenMP workers keep the tile state (8 KiB more to
// save on a context switch).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512bf16,amx-tile,amx-bf16")

namespace activekv::cpu::detail {
namespace {

constexpr int kTileRows = 16;      // tokens per score tile, channel pairs per query tile
constexpr int kTileBytes = 64;     // bytes per tile row: 16 fp32, 32 bf16
constexpr int kMaxChunks = 16;     // head_dim <= 512 (32 channels a chunk)
constexpr int kBlockTokens = 32;   // two score tiles

/// The tile configuration (palette 1): tiles 0..5, 16 rows of 64 bytes each.
///   0, 1: scores of tokens t0.. t0+15, t0+16.. t0+31 (fp32, column = head)
///   2, 3: those tokens' key chunk (32 bf16 channels)
///   4, 5: the query chunk's hi and lo terms (VNNI: row = channel pair)
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

TileConfig make_config() {
  TileConfig c;
  for (int t = 0; t < 6; ++t) {
    c.colsb[t] = kTileBytes;
    c.rows[t] = kTileRows;
  }
  return c;
}

/// Per thread: the zero-padded tail rows and the score tiles (34 KiB: on the
/// heap, at a thread's first item -- as static TLS it came out of every
/// thread's stack, AMX or not).
struct Scratch {
  alignas(64) uint16_t tail[kBlockTokens * 32 * kMaxChunks];
  alignas(64) float s[kBlockTokens * 16];
};
Scratch& scratch() {
  thread_local Scratch* s = nullptr;
  thread_local struct Free {
    Scratch*& p;
    ~Free() { delete p; }
  } free_at_exit{s};
  if (s == nullptr) s = new Scratch;
  return *s;
}

/// GCC's tile loads are asm without a memory clobber: this orders the
/// stores into the scratch (the tail copy) before them. The packed query is
/// written before the items start (decode_attention.cpp: an OpenMP loop and
/// its barrier).
inline void scratch_written() { asm volatile("" ::: "memory"); }

/// VNNI layout of one query term: tile row r of chunk c holds, for head h,
/// channels 32c + 2r and 32c + 2r + 1 at uint16 offsets 2h and 2h + 1.
void pack_term(const uint16_t* q, int group, int d, uint16_t* out) {
  const int nc = d / 32;
  for (int c = 0; c < nc; ++c) {
    uint16_t* t = out + size_t(c) * kTileRows * 32;
    std::memset(t, 0, sizeof(uint16_t) * kTileRows * 32);
    for (int h = 0; h < group; ++h)
      for (int r = 0; r < kTileRows; ++r) {
        t[r * 32 + 2 * h] = q[size_t(h) * d + 32 * c + 2 * r];
        t[r * 32 + 2 * h + 1] = q[size_t(h) * d + 32 * c + 2 * r + 1];
      }
  }
}

/// Scores of 32 key rows at k (row stride d bf16) into sc.s [32][16]; the
/// query tiles at q: [2][d / 32][16 x 32] (pack_query_amx). The key rows of
/// a block ahead (`ahead`, `ahead_bytes`; none when null) are prefetched a
/// share per chunk, between the tile loads: all at once before the block,
/// the core stalled on its fill buffers there (half the item's profile
/// samples); spread, one thread on the dev VM, 27B shape, 8K x 8 layers,
/// alternating runs: 3.89-3.99 against 4.10-4.13 ms per layer.
void block_scores(const uint16_t* k, const uint16_t* q, int d, Scratch& sc, const char* ahead, int ahead_bytes) {
  const int nc = d / 32;
  const int stride = 2 * d;
  const int per_chunk = (ahead_bytes / nc + 63) / 64 * 64;
  _tile_zero(0);
  _tile_zero(1);
  for (int c = 0; c < nc; ++c) {
    for (int b = c * per_chunk; b < (c + 1) * per_chunk && b < ahead_bytes; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
    _tile_loadd(2, k + 32 * c, stride);
    _tile_loadd(3, k + size_t(kTileRows) * d + 32 * c, stride);
    _tile_loadd(4, q + size_t(c) * kTileRows * 32, kTileBytes);
    _tile_dpbf16ps(0, 2, 4);
    _tile_dpbf16ps(1, 3, 4);
    _tile_loadd(5, q + size_t(nc + c) * kTileRows * 32, kTileBytes);
    _tile_dpbf16ps(0, 2, 5);
    _tile_dpbf16ps(1, 3, 5);
  }
  _tile_stored(0, sc.s, kTileBytes);
  _tile_stored(1, sc.s + kTileRows * 16, kTileBytes);
}

// Key rows this far ahead of the block being scored are prefetched.
constexpr int kPrefetchBlocks = 2;

void bf16_scores_amx(const Bf16Item& it, int group, int d, float scale, float* scores) {
  static const TileConfig cfg = make_config();
  _tile_loadconfig(&cfg);
  Scratch& sc = scratch();
  const uint16_t* q = it.q_tiles;  // packed by the caller, once per KV head (kernels.h)
  const int n = it.n;
  for (int t0 = 0; t0 < n; t0 += kBlockTokens) {
    const int nt = n - t0 < kBlockTokens ? n - t0 : kBlockTokens;
    const uint16_t* k = it.k + size_t(t0) * d;
    const char* ahead_p = nullptr;
    int ahead_bytes = 0;
    if (nt < kBlockTokens) {  // the tail: zero rows past the item
      std::memcpy(sc.tail, k, size_t(nt) * d * 2);
      std::memset(sc.tail + size_t(nt) * d, 0, size_t(kBlockTokens - nt) * d * 2);
      k = sc.tail;
      scratch_written();
    } else {
      const int ahead = t0 + kPrefetchBlocks * kBlockTokens;
      const int n_ahead = n - ahead < kBlockTokens ? n - ahead : kBlockTokens;
      if (n_ahead > 0) {
        ahead_p = reinterpret_cast<const char*>(it.k + size_t(ahead) * d);
        ahead_bytes = n_ahead * d * 2;
      }
    }
    block_scores(k, q, d, sc, ahead_p, ahead_bytes);
    for (int i = 0; i < nt; ++i)
      for (int h = 0; h < group; ++h) scores[size_t(h) * n + t0 + i] = sc.s[i * 16 + h] * scale;
  }
}

}  // namespace

void pack_query_amx(const uint16_t* q_hi, const uint16_t* q_lo, int group, int d, uint16_t* out) {
  pack_term(q_hi, group, d, out);
  pack_term(q_lo, group, d, out + amx_query_elems(d) / 2);
}

void bf16_item_amx(const Bf16Item& it, int group, int d, float scale, float* scores, float* o, float* lse) {
  bf16_scores_amx(it, group, d, scale, scores);
  bf16_finish_avx512(it, group, d, scores, o, lse);
}

}  // namespace activekv::cpu::detail

#pragma GCC pop_options
