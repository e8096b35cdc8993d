// AMX CPU items (kernels.h): q.k and P.V of bf16 and int8s items on the tile
// unit, the softmax between them by the AVX-512 kernel's code
// (softmax_rows_avx512). Like kernels_avx512.cpp, the only TU compiled for
// AMX (the pragma below, after the includes), using no C++ library
// templates; decode_attention.cpp calls it only where cpu_has_amx_kernels().
//
// Why: the AVX-512 item spends ~96 dpbf16 per key row (G = 6 heads x 8
// chunks x 2 query terms) on q.k and 96 fp32 FMAs per value row on P.V,
// which keeps a core below its share of the host's read bandwidth.
//
// q.k: the key rows of a page are the A operand as they lie -- 16 tokens x
// 32 channels of bf16, rows d * 2 bytes apart -- and the query the B
// operand: S^T (16 tokens x 16 columns) += K_chunk . Q_chunk^T, the query in
// the VNNI layout the tile unit wants (for each pair of channels, every
// column's two values side by side), built once per KV head and call by the
// caller (pack_query_amx; packed per item it took ~2 % of the kernels'
// samples in a profile: perf, dev VM, 27B shape, 8K x 8 layers, one thread).
// The query's two bf16 terms (hi + the rounding residual, as the AVX-512
// kernel) are columns h and G + h of the one query tile, so one tile product
// gives both terms' dots (half the products of a tile per term); a head's
// score is their sum. Columns past 2G are zero. Two score tiles of 16 tokens
// each share every query tile load; a split's last tokens (fewer than 32)
// are copied into a zeroed buffer first, so no tile reads past the item's
// rows. The score tiles come out token-major and are transposed in
// registers to the softmax's head-major rows.
//
// P.V: O (rows x 16 channels) += P (rows x 32 tokens) . V (32 tokens x 16
// channels). P = exp(s - m) enters as three bf16 terms hi + mid + lo, each
// the rounding residual of the one before, which sum to the fp32 p exactly
// (8 + 8 + 8 significant bits; as the GPU decode kernel's P): rows
// term * G + h, 3G rows in one or two A tiles. V is exact in bf16; the tile
// unit wants it in token pairs (for each channel, tokens 2i and 2i + 1 side
// by side), so each item's value rows are interleaved into the scratch once
// (unpack of two rows: channel tiles hold channels in the unpack's order,
// undone when the output tiles are read). The three terms' rows are summed
// lo + mid + hi per head, in fixed order: the same bits run to run.
//
// int8s: the same item with the codes -- q.k by tdpbssd on 64-channel
// key-code rows against the int8 query terms (columns h and G + h), exact
// int32 dots turned into scores by the reference's float arithmetic lane by
// lane (bitwise the reference's). P.V by tdpbusd on the codes as they are:
// x = 255 p enters as four base-256 digits (uint8: x = D0 + D1 / 256 +
// D2 / 256^2 + D3 / 256^3, truncated below 2^-24: an absolute error under
// 2^-24 / 255 in p, where the row's largest p is 1 and l >= 1; where x >= 1
// the digits hold x exactly), rows digit * G + h; V in quads (for each
// channel, tokens 4i .. 4i + 3 side by side: a byte interleave as each block
// is scored, no conversion), 64 tokens a tile step. Each digit's dots are
// exact int32 sums (n x 255 x 127: page_size <= 65536, use_amx; exact as
// fp32 too for items of up to 518 tokens -- the engine's splits are 512 --,
// else rounded once), weighted and summed from the last digit to the first,
// then the page's value scale per channel and 1 / (255 l). Against P.V in bf16 with the codes widened (three P terms,
// two 32-token steps per 64 tokens): half the tile products and no widening.
// (An earlier tdpbssd q.k, two query tiles and a scalar score copy, measured
// slower than the AVX-512 dpbusd kernel: 3.07 against 2.61 ms per layer,
// 27B shape, 8K, one thread.)
//
// The tile configuration is loaded per item and phase (another library may
// have loaded its own) and the tiles are not released after: releasing per
// item cost ~3 % there; the OpenMP workers keep the tile state (8 KiB more to
// save on a context switch).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels.h"

#pragma GCC push_options
// GCC 12's masked forms behind _mm512_unpack*, _mm512_shuffle_* and
// _mm512_setzero_* start from _mm512_undefined_*: a false
// -W(maybe-)uninitialized once inlined (as in kernels_avx512.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi,amx-tile,amx-bf16,amx-int8")
#include "transpose16.h"  // after the pragma: compiled for this TU's target

namespace activekv::cpu::detail {
namespace {

constexpr int kTileRows = 16;      // tokens per score tile, channel pairs per query tile
constexpr int kTileBytes = 64;     // bytes per tile row: 16 fp32, 32 bf16
constexpr int kMaxChunks = 16;     // head_dim <= 512 (32 channels a chunk)
constexpr int kBlockTokens = 32;   // two score tiles

/// The q.k tile configuration (palette 1): tiles 0..7, 16 rows of 64 bytes each.
///   0, 1: scores of tokens t0.. t0+15, t0+16.. t0+31 (fp32, column h: head
///         h's hi term, G + h: its lo term)
///   2, 3 (5, 6 for odd chunks): those tokens' key chunk (32 bf16 channels)
///   4 (7): the query chunk, both terms (VNNI: row = channel pair)
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

TileConfig make_config() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = kTileBytes;
    c.rows[t] = kTileRows;
  }
  return c;
}

/// Per thread: the zero-padded tail rows, the score tiles and the int8s query (42 KiB: on the
/// heap, at a thread's first item -- as static TLS it came out of every
/// thread's stack, AMX or not).
struct Scratch {
  alignas(64) uint16_t tail[kBlockTokens * 32 * kMaxChunks];
  alignas(64) float s[kBlockTokens * 16];                  // int32 dots for int8s
  alignas(64) int8_t q8[kMaxChunks / 2 * kTileRows * 64];  // int8s: the item's query tiles
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


/// One 32-token block ahead: its key and value rows (`bytes` each; none
/// when 0), prefetched a share per chunk of the block being scored.
struct Ahead {
  const char* k = nullptr;
  const char* v = nullptr;
  int bytes = 0;
};

/// Dots of 32 key rows at k (row stride `d` elements) with the query tiles
/// at q ([d * sizeof(T) / 64][16 x 64 bytes], pack_query_amx or
/// pack_int8s_query) into sc.s [32][16]: T = uint16_t (bf16 keys, fp32 dots
/// by tdpbf16ps, 32 channels a chunk) or int8_t (key codes, exact int32 dots
/// by tdpbssd, 64 channels a chunk). The rows of a block ahead are
/// prefetched a share per chunk, between the tile loads: all at once before
/// the block, the core stalled on its fill buffers there (half the item's
/// profile samples); spread, one thread on the dev VM, 27B shape, 8K x 8
/// layers, alternating runs: 3.89-3.99 against 4.10-4.13 ms per layer.
template <class T>
void block_dots(const T* k, const void* q, int d, Scratch& sc, Ahead ahead) {
  constexpr int per_chunk_elems = kTileBytes / int(sizeof(T));
  const int nc = d / per_chunk_elems;
  const int stride = d * int(sizeof(T));
  const auto* qb = static_cast<const char*>(q);
  const int per_chunk = (ahead.bytes / nc + 63) / 64 * 64;
  _tile_zero(0);
  _tile_zero(1);
  for (int c = 0; c < nc; ++c) {
    for (int b = c * per_chunk; b < (c + 1) * per_chunk && b < ahead.bytes; b += 64) {
      _mm_prefetch(ahead.k + b, _MM_HINT_T0);
      _mm_prefetch(ahead.v + b, _MM_HINT_T0);
    }
    const T* kc = k + per_chunk_elems * c;
    const char* qc = qb + size_t(c) * kTileRows * kTileBytes;
    // Even and odd chunks use different tiles (there is no renaming of tile
    // registers): the next chunk's loads issue while this chunk's products run.
    if (c % 2 == 0) {
      _tile_loadd(2, kc, stride);
      _tile_loadd(3, kc + size_t(kTileRows) * d, stride);
      _tile_loadd(4, qc, kTileBytes);
      if constexpr (sizeof(T) == 2) {  // (GCC's tile intrinsics paste their tile numbers into the asm: literals)
        _tile_dpbf16ps(0, 2, 4);
        _tile_dpbf16ps(1, 3, 4);
      } else {
        _tile_dpbssd(0, 2, 4);
        _tile_dpbssd(1, 3, 4);
      }
    } else {
      _tile_loadd(5, kc, stride);
      _tile_loadd(6, kc + size_t(kTileRows) * d, stride);
      _tile_loadd(7, qc, kTileBytes);
      if constexpr (sizeof(T) == 2) {
        _tile_dpbf16ps(0, 5, 7);
        _tile_dpbf16ps(1, 6, 7);
      } else {
        _tile_dpbssd(0, 5, 7);
        _tile_dpbssd(1, 6, 7);
      }
    }
  }
  _tile_stored(0, sc.s, kTileBytes);
  _tile_stored(1, sc.s + kTileRows * 16, kTileBytes);
}

/// The bf16 value rows of the 32-token block at t0, v [nt][d] (nt <= 32),
/// into the pair layout bf16 P.V reads: at base + t0 * d, [d / 16][16][32]
/// bf16, channel tile j, token pair i holding (v[2i][c], v[2i + 1][c]) for
/// its 16 channels c (a B tile, 1 KiB); rows past nt are zero. The 32
/// channels 32m.. of a row pair become channel tiles 2m (their unpacklo:
/// channels 8L + 0..3 of each 128-bit lane L) and 2m + 1 (unpackhi: 8L +
/// 4..7). A block's tiles are contiguous, so its stores fill whole lines of
/// one 16 KiB stretch (d 256); packed right after the block's q.k, so the
/// value rows stream in beside the keys and the loads overlap the tile unit.
void pack_v_block(const uint16_t* v, int d, int nt, int t0, void* base) {
  uint16_t* vn = static_cast<uint16_t*>(base) + size_t(t0) * d;
  const int nc = d / 32;
  for (int i = 0; i < kTileRows; ++i) {
    const int r0 = 2 * i, r1 = r0 + 1;
    for (int m = 0; m < nc; ++m) {
      const __m512i a = r0 < nt ? _mm512_loadu_si512(v + size_t(r0) * d + 32 * m) : _mm512_setzero_si512();
      const __m512i b = r1 < nt ? _mm512_loadu_si512(v + size_t(r1) * d + 32 * m) : _mm512_setzero_si512();
      _mm512_store_si512(vn + (size_t(2 * m) * kTileRows + i) * 32, _mm512_unpacklo_epi16(a, b));
      _mm512_store_si512(vn + (size_t(2 * m + 1) * kTileRows + i) * 32, _mm512_unpackhi_epi16(a, b));
    }
  }
}

/// Byte indices of two-row interleaves (permutex2var_epi8: 0..63 the first
/// row, 64..127 the second): channels 0..31 of both rows, pairwise, then 32..63.
struct QuadIndex {
  __m512i pair_lo, pair_hi, quad_lo, quad_hi;
  QuadIndex() {
    alignas(64) uint8_t lo[64], hi[64];
    alignas(64) uint16_t qlo[32], qhi[32];
    for (int c = 0; c < 32; ++c) {
      lo[2 * c] = uint8_t(c), lo[2 * c + 1] = uint8_t(64 + c);
      hi[2 * c] = uint8_t(32 + c), hi[2 * c + 1] = uint8_t(96 + c);
    }
    for (int c = 0; c < 16; ++c) {  // words: (a, b) pairs of channel c, then (c, d) pairs of it
      qlo[2 * c] = uint16_t(c), qlo[2 * c + 1] = uint16_t(32 + c);
      qhi[2 * c] = uint16_t(16 + c), qhi[2 * c + 1] = uint16_t(48 + c);
    }
    pair_lo = _mm512_load_si512(lo);
    pair_hi = _mm512_load_si512(hi);
    quad_lo = _mm512_load_si512(qlo);
    quad_hi = _mm512_load_si512(qhi);
  }
};

/// The value codes of the 32-token block at t0, v [nt][d] (nt <= 32), into
/// the quad layout int8 P.V reads: base [n64 / 64][d / 16][16][64] bytes,
/// row i of channel tile j of step s holding, for its 16 channels c in
/// order, the codes of tokens 64s + 4i .. 64s + 4i + 3 (a B tile of
/// tdpbusd, 1 KiB); the block fills rows (t0 % 64) / 4 .. + 7 of step t0 /
/// 64, rows past nt zero. A step's second half that no block reaches (an
/// item of n % 64 <= 32) keeps stale codes: P's digits there are zero, so
/// they add exact zeros. Two byte permutes pair the rows, two word permutes
/// make quads: no conversion.
void pack_v_block(const int8_t* v, int d, int nt, int t0, void* base) {
  static const QuadIndex ix;
  int8_t* step = static_cast<int8_t*>(base) + size_t(t0 / 64) * 64 * d;
  const int row0 = (t0 % 64) / 4;
  auto row = [&](int r, int m) {
    return r < nt ? _mm512_loadu_si512(v + size_t(r) * d + 64 * m) : _mm512_setzero_si512();
  };
  for (int i = 0; i < 8; ++i) {
    for (int m = 0; m < d / 64; ++m) {
      const __m512i a = row(4 * i, m), b = row(4 * i + 1, m), c = row(4 * i + 2, m), e = row(4 * i + 3, m);
      const __m512i ab_lo = _mm512_permutex2var_epi8(a, ix.pair_lo, b), ab_hi = _mm512_permutex2var_epi8(a, ix.pair_hi, b);
      const __m512i ce_lo = _mm512_permutex2var_epi8(c, ix.pair_lo, e), ce_hi = _mm512_permutex2var_epi8(c, ix.pair_hi, e);
      int8_t* out = step + size_t(4 * m) * kTileRows * 64 + size_t(row0 + i) * 64;
      _mm512_store_si512(out, _mm512_permutex2var_epi16(ab_lo, ix.quad_lo, ce_lo));
      _mm512_store_si512(out + kTileRows * 64, _mm512_permutex2var_epi16(ab_lo, ix.quad_hi, ce_lo));
      _mm512_store_si512(out + 2 * kTileRows * 64, _mm512_permutex2var_epi16(ab_hi, ix.quad_lo, ce_hi));
      _mm512_store_si512(out + 3 * kTileRows * 64, _mm512_permutex2var_epi16(ab_hi, ix.quad_hi, ce_hi));
    }
  }
}

/// A block's dots (sc.s [32][16], token-major) a 16-token half at a time,
/// transposed in registers: write(x, t, live) gets x[j] = column j of the
/// item's tokens t..t + 15, `live` those of them in the block.
template <class Write>
void for_each_half(const Scratch& sc, int t0, int nt, Write write) {
  for (int half = 0; half * 16 < nt; ++half) {
    const int live_n = nt - 16 * half < 16 ? nt - 16 * half : 16;
    const __mmask16 live = live_n == 16 ? __mmask16(0xffff) : __mmask16((1u << live_n) - 1u);
    __m512i x[16];
    for (int r = 0; r < 16; ++r) x[r] = _mm512_load_si512(sc.s + (16 * half + r) * 16);
    transpose16(x);
    write(x, t0 + 16 * half, live);
  }
}

// Rows this far ahead of the block being scored are prefetched.
constexpr int kPrefetchBlocks = 2;

/// The q.k pass of an item of n tokens (key rows k, value rows v: [n][d] of
/// T, bf16 or int8 codes; q: its query tiles): per 32-token block the dots
/// (block_dots; a last block of fewer rows through a zeroed copy, so no tile
/// reads past the item), the block's value rows packed into vn in the
/// layout of the format's P.V (pack_v_block; none when null), then
/// write(x, t, live) per 16-token half of the dots (for_each_half).
template <class T, class Write>
void score_blocks(const T* k_rows, const T* v_rows, int n, int d, const void* q, void* vn, Write write) {
  static const TileConfig cfg = make_config();
  _tile_loadconfig(&cfg);
  Scratch& sc = scratch();
  const size_t row_bytes = size_t(d) * sizeof(T);
  for (int t0 = 0; t0 < n; t0 += kBlockTokens) {
    const int nt = n - t0 < kBlockTokens ? n - t0 : kBlockTokens;
    const T* k = k_rows + size_t(t0) * d;
    Ahead ahead;
    if (nt < kBlockTokens) {  // the tail: zero rows past the item
      auto* tail = reinterpret_cast<T*>(sc.tail);
      std::memcpy(tail, k, size_t(nt) * row_bytes);
      std::memset(tail + size_t(nt) * d, 0, size_t(kBlockTokens - nt) * row_bytes);
      k = tail;
    } else {
      const int t_ahead = t0 + kPrefetchBlocks * kBlockTokens;
      const int n_ahead = n - t_ahead < kBlockTokens ? n - t_ahead : kBlockTokens;
      if (n_ahead > 0) {
        ahead.k = reinterpret_cast<const char*>(k_rows + size_t(t_ahead) * d);
        ahead.v = reinterpret_cast<const char*>(v_rows + size_t(t_ahead) * d);
        ahead.bytes = int(size_t(n_ahead) * row_bytes);
      }
    }
    scratch_written();  // the query's and the tail's stores before the tile loads
    block_dots(k, q, d, sc, ahead);
    if (vn != nullptr) pack_v_block(v_rows + size_t(t0) * d, d, nt, t0, vn);
    scratch_written();  // the dot tiles' stores before the vector loads
    for_each_half(sc, t0, nt, write);
  }
}

/// bf16 scores [group][n] (scaled q.k: a head's two query terms, columns h
/// and G + h, summed), the value rows packed into vn on the way.
void bf16_scores_amx(const Bf16Item& it, int group, int d, float scale, float* scores, void* vn) {
  const __m512 sv = _mm512_set1_ps(scale);
  // The query tiles: packed by the caller, once per KV head (kernels.h).
  score_blocks(it.k, it.v, it.n, d, it.q_tiles, vn, [&](const __m512i* x, int t, __mmask16 live) {
    for (int h = 0; h < group; ++h) {
      const __m512 s = _mm512_add_ps(_mm512_castsi512_ps(x[h]), _mm512_castsi512_ps(x[group + h]));
      _mm512_mask_storeu_ps(scores + size_t(h) * it.n + t, live, _mm512_mul_ps(s, sv));
    }
  });
}

// ---- int8s q.k ---------------------------------------------------------------

/// The item's int8s query as tdpbssd's B operand: tile row r of chunk c (64
/// channels) holds, for column j, channels 64c + 4r .. 64c + 4r + 3 at bytes
/// 4j .. 4j + 3; column h < G is head h's first term (qq), G + h its second
/// (qq_lo; zero with one term), the rest zero. Per item: the query is per
/// (page, KV head), and this is ~3 KiB of stores against the item's ~64 KiB
/// of key codes.
void pack_int8s_query(const Int8sItem& it, int group, int d, int8_t* out) {
  const int nc = d / 64;
  std::memset(out, 0, size_t(nc) * kTileRows * 64);
  const int cols = (it.terms == 2 ? 2 : 1) * group;
  for (int c = 0; c < nc; ++c) {
    int8_t* t = out + size_t(c) * kTileRows * 64;
    for (int j = 0; j < cols; ++j) {
      const int8_t* q = (j < group ? it.qq : it.qq_lo) + size_t(j % group) * d + 64 * c;
      for (int r = 0; r < kTileRows; ++r) std::memcpy(t + r * 64 + 4 * j, q + 4 * r, 4);
    }
  }
}

/// int8s scores [group][n] on the tile unit, and (vn not null) the item's
/// value codes packed for P.V on the way. The dots (first query term in
/// column h, second in G + h) are exact; the scores take the reference's
/// float arithmetic (attention_int8s.cpp) lane by lane, ((dot + dot_lo /
/// 127) * s_t) * row_scale[h]: bitwise the reference's scores.
void int8s_scores_tiles(const Int8sItem& it, int group, int d, float* scores, void* vn) {
  Scratch& sc = scratch();
  pack_int8s_query(it, group, d, sc.q8);
  score_blocks(it.kq, it.vq, it.n, d, sc.q8, vn, [&](const __m512i* x, int t, __mmask16 live) {
    const __m512 tok = _mm512_maskz_loadu_ps(live, it.s + t);
    for (int h = 0; h < group; ++h) {
      __m512 dot = _mm512_cvtepi32_ps(x[h]);
      if (it.terms == 2) dot = _mm512_add_ps(dot, _mm512_div_ps(_mm512_cvtepi32_ps(x[group + h]), _mm512_set1_ps(127.0f)));
      const __m512 s = _mm512_mul_ps(_mm512_mul_ps(dot, tok), _mm512_set1_ps(it.row_scale[h]));
      _mm512_mask_storeu_ps(scores + size_t(h) * it.n + t, live, s);
    }
  });
}

// ---- P.V -------------------------------------------------------------------

/// P.V tile configuration for G heads (R = terms x G rows of P: 3 bf16
/// terms, or 4 uint8 digits for int8s):
///   0, 1: P rows 0..15 and 16..R-1 (bf16, 32 tokens a row; uint8, 64); 1 unused when R <= 16
///   2, 3: V channel tiles 2m and 2m + 1 of a 32-channel chunk m (16 token pairs / quads x 16 channels)
///   4 + 2a + b: O rows of P tile a, channel tile b (fp32; int32 for int8s)
struct PvConfigs {
  TileConfig by_group[9];
};
PvConfigs make_pv_configs(int terms) {
  PvConfigs p;
  for (int g = 1; g <= 8; ++g) {
    TileConfig& c = p.by_group[g];
    for (int a = 0; a < 2; ++a) {
      const int rows = terms * g - 16 * a > 16 ? 16 : terms * g - 16 * a;
      if (rows <= 0) continue;
      c.rows[a] = c.rows[4 + 2 * a] = c.rows[5 + 2 * a] = uint8_t(rows);
      c.colsb[a] = c.colsb[4 + 2 * a] = c.colsb[5 + 2 * a] = kTileBytes;
    }
    c.rows[2] = c.rows[3] = kTileRows;
    c.colsb[2] = c.colsb[3] = kTileBytes;
  }
  return p;
}

inline __m512 widen_bf16(__m256bh x) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)x), 16));  // exact
}

/// P [G][n] fp32 -> pt [3][G][n32] bf16 terms: hi = bf16(p), mid = bf16(p -
/// hi), lo = bf16(p - hi - mid), each residual exact in fp32; zero past n.
void pack_p_terms(const float* p, int group, int n, int n32, uint16_t* pt) {
  for (int h = 0; h < group; ++h) {
    for (int t = 0; t < n32; t += 16) {
      const __mmask16 live = n - t >= 16 ? __mmask16(0xffff) : n > t ? __mmask16((1u << (n - t)) - 1u) : 0;
      const __m512 x = _mm512_maskz_loadu_ps(live, p + size_t(h) * n + t);
      const __m256bh hi = _mm512_cvtneps_pbh(x);
      const __m512 r1 = _mm512_sub_ps(x, widen_bf16(hi));
      const __m256bh mid = _mm512_cvtneps_pbh(r1);
      const __m256bh lo = _mm512_cvtneps_pbh(_mm512_sub_ps(r1, widen_bf16(mid)));
      _mm256_store_si256(reinterpret_cast<__m256i*>(pt + (size_t(h)) * n32 + t), (__m256i)hi);
      _mm256_store_si256(reinterpret_cast<__m256i*>(pt + (size_t(group) + h) * n32 + t), (__m256i)mid);
      _mm256_store_si256(reinterpret_cast<__m256i*>(pt + (size_t(2 * group) + h) * n32 + t), (__m256i)lo);
    }
  }
}

/// Output tiles of chunk m (cs: tile 4 + t at cs + 256 t) -> o[h][32m..32m+31]
/// for each head: its three terms' rows summed lo + mid + hi, the channels
/// put back in order, times the value scales (int8s; none for bf16), times 1 / l.
void store_chunk(const float* cs, int group, int d, int m, const float* inv_l, const float* vscale, float* o) {
  // Output channels 0..15 of the chunk: lo-tile columns 0..3, hi 0..3, lo 4..7, hi 4..7; 16..31 the next eight.
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int h = 0; h < group; ++h) {
    __m512 sum[2];
    for (int b = 0; b < 2; ++b) {
      __m512 acc = _mm512_setzero_ps();
      for (int term = 2; term >= 0; --term) {
        const int r = term * group + h;
        acc = _mm512_add_ps(acc, _mm512_load_ps(cs + (2 * (r / 16) + b) * 256 + (r % 16) * 16));
      }
      sum[b] = acc;
    }
    const __m512 inv = _mm512_set1_ps(inv_l[h]);
    float* out = o + size_t(h) * d + 32 * m;
    __m512 x0 = _mm512_permutex2var_ps(sum[0], first, sum[1]), x1 = _mm512_permutex2var_ps(sum[0], second, sum[1]);
    if (vscale != nullptr) {  // SPEC 3.3: the page's value scale once per channel, as the AVX-512 kernel
      x0 = _mm512_mul_ps(_mm512_loadu_ps(vscale + 32 * m), x0);
      x1 = _mm512_mul_ps(_mm512_loadu_ps(vscale + 32 * m + 16), x1);
    }
    _mm512_storeu_ps(out, _mm512_mul_ps(x0, inv));
    _mm512_storeu_ps(out + 16, _mm512_mul_ps(x1, inv));
  }
}

/// P digits for int8s P.V: P [G][n] fp32 -> pd [4][G][n64] uint8, the
/// base-256 digits of x = 255 p (x = D0 + D1 / 256 + D2 / 256^2 + D3 /
/// 256^3, truncated below 2^-24; each digit the floor of the exact residual
/// times 256); zero past n.
void pack_p_digits(const float* p, int group, int n, int n64, uint8_t* pd) {
  const __m512 base = _mm512_set1_ps(256.0f), top = _mm512_set1_ps(255.0f);
  for (int h = 0; h < group; ++h) {
    for (int t = 0; t < n64; t += 16) {
      const __mmask16 live = n - t >= 16 ? __mmask16(0xffff) : n > t ? __mmask16((1u << (n - t)) - 1u) : 0;
      __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(live, p + size_t(h) * n + t), top);
      for (int k = 0; k < 4; ++k) {
        const __m512 digit = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
        _mm_store_si128(reinterpret_cast<__m128i*>(pd + (size_t(k) * group + h) * n64 + t),
                        _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(digit)));
        x = _mm512_mul_ps(_mm512_sub_ps(x, digit), base);  // exact: a residual in [0, 1) times a power of 2
      }
    }
  }
}

/// int8s output tiles of chunk m (cs: int32 tile 4 + t at cs + 256 t) ->
/// o[h][32m..32m+31]: each head's four digit rows as exact fp32 integers,
/// weighted 256^-k and summed from the last digit to the first, times the
/// value scales and 1 / (255 l). Channels are in order (the quad layout).
void store_chunk_digits(const float* cs, int group, int d, int m, const float* inv_l, const float* vscale, float* o) {
  const int32_t* ci = reinterpret_cast<const int32_t*>(cs);
  for (int h = 0; h < group; ++h) {
    const __m512 inv = _mm512_set1_ps(inv_l[h] / 255.0f);
    float* out = o + size_t(h) * d + 32 * m;
    for (int b = 0; b < 2; ++b) {
      __m512 acc = _mm512_setzero_ps();
      for (int k = 3; k >= 0; --k) {
        const int r = k * group + h;
        const __m512 dots = _mm512_cvtepi32_ps(_mm512_load_si512(ci + (2 * (r / 16) + b) * 256 + (r % 16) * 16));
        acc = _mm512_fmadd_ps(acc, _mm512_set1_ps(1.0f / 256.0f), dots);  // exact scaling by a power of 2
      }
      const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(vscale + 32 * m + 16 * b), acc);
      _mm512_storeu_ps(out + 16 * b, _mm512_mul_ps(x, inv));
    }
  }
}

/// O = P.V / l on the tile unit, NA P tiles (1: at most 16 rows of P, 2:
/// more). kInt8: P's uint8 digits against value quads (tdpbusd, 64 tokens a
/// step), else P's bf16 terms against value pairs (tdpbf16ps, 32 tokens).
template <int NA, bool kInt8>
void pv_tiles(const void* p_rows, const void* v_tiles, int group, int d, int n_pad, const float* inv_l,
              const float* vscale, float* cs, NextRows next, float* o) {
  constexpr int kStep = kInt8 ? 64 : 32;                                  // tokens per tile step
  const char* pt = static_cast<const char*>(p_rows);
  const char* vn = static_cast<const char*>(v_tiles);
  const int p_stride = kInt8 ? n_pad : 2 * n_pad;  // bytes between P rows
  // The next item's first rows, prefetched a share per tile step.
  const int next_lines = (next.bytes + 63) / 64, steps = d / 32 * (n_pad / kStep);
  const int lines_per = (next_lines + steps - 1) / steps;
  int next_done = 0;
  const size_t block = size_t(kStep) * d * (kInt8 ? 1 : 2);  // bytes per step of packed value rows
  for (int m = 0; m < d / 32; ++m) {
    const char* b0 = vn + size_t(2 * m) * kTileRows * kTileBytes;  // step 0's channel tiles 2m, 2m + 1
    const char* b1 = b0 + kTileRows * kTileBytes;
    _tile_zero(4);
    _tile_zero(5);
    if constexpr (NA == 2) {
      _tile_zero(6);
      _tile_zero(7);
    }
    for (int s = 0; s < n_pad / kStep; ++s) {
      if (next_lines > 0) {  // a share of the next item's first rows, into L2 (not needed before it starts)
        for (int l = 0; l < lines_per && next_done < next_lines; ++l, ++next_done) {
          _mm_prefetch(next.k + 64 * next_done, _MM_HINT_T1);
          _mm_prefetch(next.v + 64 * next_done, _MM_HINT_T1);
        }
      }
      _tile_loadd(0, pt + kTileBytes * s, p_stride);
      _tile_loadd(2, b0 + size_t(s) * block, kTileBytes);
      _tile_loadd(3, b1 + size_t(s) * block, kTileBytes);
      if constexpr (kInt8) {  // (literal tile numbers: GCC pastes them into the asm)
        _tile_dpbusd(4, 0, 2);
        _tile_dpbusd(5, 0, 3);
      } else {
        _tile_dpbf16ps(4, 0, 2);
        _tile_dpbf16ps(5, 0, 3);
      }
      if constexpr (NA == 2) {
        _tile_loadd(1, pt + size_t(16) * p_stride + kTileBytes * s, p_stride);
        if constexpr (kInt8) {
          _tile_dpbusd(6, 1, 2);
          _tile_dpbusd(7, 1, 3);
        } else {
          _tile_dpbf16ps(6, 1, 2);
          _tile_dpbf16ps(7, 1, 3);
        }
      }
    }
    _tile_stored(4, cs, kTileBytes);
    _tile_stored(5, cs + 256, kTileBytes);
    if constexpr (NA == 2) {
      _tile_stored(6, cs + 512, kTileBytes);
      _tile_stored(7, cs + 768, kTileBytes);
    }
    scratch_written();  // the tile stores before the vector loads of store_chunk
    if constexpr (kInt8) {
      store_chunk_digits(cs, group, d, m, inv_l, vscale, o);
    } else {
      store_chunk(cs, group, d, m, inv_l, vscale, o);
    }
  }
}

/// Where an item's AMX scratch lies (kernels.h: amx_pv_scratch_elems), bf16:
/// P's terms [3G][n32] bf16, the value pairs [n32 / 32][d / 16][16][32]
/// bf16; int8s: P's digits [4G][n64] uint8, the value quads [n64 / 64][d /
/// 16][16][64] bytes; then the output tiles. Every part 64-byte aligned.
struct PvScratch {
  int n_pad;  // n rounded up to the tile step
  char* p;
  char* v;
  float* cs;
  PvScratch(uint16_t* base, int group, int d, int n, bool int8)
      : n_pad(int8 ? (n + 63) / 64 * 64 : (n + 31) / 32 * 32),
        p(reinterpret_cast<char*>(base)),
        v(p + size_t(int8 ? 4 : 3 * 2) * group * n_pad),
        cs(reinterpret_cast<float*>(v + size_t(d) * n_pad * (int8 ? 1 : 2))) {}
};

/// O = (vscale *) P.V / l: p [group][n] the softmax's exp(s - m), the value
/// rows already packed into sc.v (bf16 pairs, or int8s quads: kInt8).
template <bool kInt8>
void pv_amx(const PvScratch& sc, int n, int group, int d, const float* p, const float* inv_l, const float* vscale,
            NextRows next, float* o) {
  static const PvConfigs cfg = make_pv_configs(kInt8 ? 4 : 3);
  if constexpr (kInt8) {
    pack_p_digits(p, group, n, sc.n_pad, reinterpret_cast<uint8_t*>(sc.p));
  } else {
    pack_p_terms(p, group, n, sc.n_pad, reinterpret_cast<uint16_t*>(sc.p));
  }
  scratch_written();
  _tile_loadconfig(&cfg.by_group[group]);
  if ((kInt8 ? 4 : 3) * group > 16) {
    pv_tiles<2, kInt8>(sc.p, sc.v, group, d, sc.n_pad, inv_l, vscale, sc.cs, next, o);
  } else {
    pv_tiles<1, kInt8>(sc.p, sc.v, group, d, sc.n_pad, inv_l, vscale, sc.cs, next, o);
  }
}

}  // namespace

/// VNNI layout of the query: tile row r of chunk c holds, for column j,
/// channels 32c + 2r and 32c + 2r + 1 at uint16 offsets 2j and 2j + 1;
/// column h < G is head h's hi term, G + h its lo term, the rest zero.
void pack_query_amx(const uint16_t* q_hi, const uint16_t* q_lo, int group, int d, uint16_t* out) {
  const int nc = d / 32;
  for (int c = 0; c < nc; ++c) {
    uint16_t* t = out + size_t(c) * kTileRows * 32;
    std::memset(t, 0, sizeof(uint16_t) * kTileRows * 32);
    for (int j = 0; j < 2 * group; ++j) {
      const uint16_t* q = (j < group ? q_hi : q_lo) + size_t(j % group) * d + 32 * c;
      for (int r = 0; r < kTileRows; ++r) {
        t[r * 32 + 2 * j] = q[2 * r];
        t[r * 32 + 2 * j + 1] = q[2 * r + 1];
      }
    }
  }
}

void bf16_item_amx(const Bf16Item& it, int group, int d, float scale, float* scores, float* o, float* lse) {
  const PvScratch sc(it.pv_tiles, group, d, it.n, false);
  bf16_scores_amx(it, group, d, scale, scores, sc.v);
  float inv_l[8];
  softmax_rows_avx512(scores, group, it.n, inv_l, lse);
  pv_amx<false>(sc, it.n, group, d, scores, inv_l, nullptr, it.next, o);
}

void int8s_scores_amx(const Int8sItem& it, int group, int d, float* scores) {
  int8s_scores_tiles(it, group, d, scores, nullptr);
}

void int8s_item_amx(const Int8sItem& it, int group, int d, float* scores, float* o, float* lse) {
  const PvScratch sc(it.pv_tiles, group, d, it.n, true);
  int8s_scores_tiles(it, group, d, scores, sc.v);
  float inv_l[8];
  softmax_rows_avx512(scores, group, it.n, inv_l, lse);
  pv_amx<true>(sc, it.n, group, d, scores, inv_l, it.vscale, it.next, o);
}

}  // namespace activekv::cpu::detail

#pragma GCC pop_options
