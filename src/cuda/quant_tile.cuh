// Internal to the CUDA backend: the tiled block-type matvec (quant_matvec.cu)
// -- its launch geometry, the loading of one tile of a row into registers and
// the dot of that tile with the int8 activations -- as __host__ __device__
// code, so that the CPU emulation (tests/cuda/matvec_emulation.h) runs exactly
// what each thread runs.
//
// A tile is 256 elements of one row: 8 blocks of a 32-element type, one
// K-quant super-block. One thread takes one tile at a time and reads all of
// its bytes with 16-byte loads before it computes anything (144 bytes for
// Q4_0 and Q4_K, 272 for Q8_0: enough bytes in flight per SM to cover HBM
// latency). A CTA takes `rows_per_cta` whole rows; its threads take the
// rows' tiles in order (thread j: tiles j, j + threads, ...), so short rows
// (20 tiles at 5120 columns) still keep the threads busy.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "quant_dot.cuh"  // XQuant

namespace activekv::cuda::qtile {

using namespace qblk;
using qdot::XQuant;

inline constexpr int kTileElems = 256;
inline constexpr int kTileUnits = kTileElems / 32;
inline constexpr int kMaxWarps = 4;  // threads per CTA <= 128

/// Most rows one CTA of the kernel for n_vec vectors holds accumulators for:
/// 8 accumulators per thread in all.
AKV_QHD constexpr int max_rows_per_cta(int n_vec) { return n_vec >= 8 ? 1 : 8 / n_vec; }

template <class T>
struct TileOf {
  static constexpr int kBlocks = kTileElems / T::kElems;
  static constexpr int kBytes = kBlocks * T::kBytes;
  static constexpr int kWords = (kBytes + 3) / 4;
  /// Rows of 16-byte multiples of whole tiles start every tile on a 16-byte boundary.
  static constexpr bool kCanAlign = kBytes % 16 == 0;
  /// 16-byte granules covering a tile that starts at any even offset in its first granule.
  static constexpr int kWindowGranules = (14 + kBytes + 15) / 16;
};

/// How a matvec of this shape is cut (the kernel and the emulation both use it).
struct Geometry {
  int tiles;         // tiles per row (the last may be partial for 32-element types)
  int rows_per_cta;  // R
  int warps;         // threads per CTA / 32
  bool aligned;      // every tile 16-byte aligned and whole: plain 16-byte loads
};

/// rows_per_cta R: as many rows as fit one tile per thread (<= 128 threads),
/// at most max_rows_per_cta(n_vec), and few enough that the grid has >= 512 CTAs when
/// the matrix has the rows (spread over every SM of an H200, 132); warps:
/// enough for R rows' tiles, at most 4.
AKV_QHD Geometry tile_geometry(int64_t rows, int64_t cols, int64_t row_bytes, int n_vec, bool can_align) {
  Geometry g{};
  g.tiles = int((cols + kTileElems - 1) / kTileElems);
  int r = g.tiles >= 32 * kMaxWarps ? 1 : 32 * kMaxWarps / g.tiles;
  r = r < max_rows_per_cta(n_vec) ? r : max_rows_per_cta(n_vec);
  const int64_t by_grid = rows / 512;
  if (by_grid < r) r = by_grid < 1 ? 1 : int(by_grid);
  g.rows_per_cta = r;
  const int64_t items = int64_t(r) * g.tiles;
  g.warps = items >= 32 * kMaxWarps ? kMaxWarps : int((items + 31) / 32);
  g.aligned = can_align && cols % kTileElems == 0 && row_bytes % 16 == 0;
  return g;
}

/// 16 bytes from a 16-byte aligned address, read-only path on the device.
AKV_QHD uint4 ldg128(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  return __ldg(reinterpret_cast<const uint4*>(p));
#else
  uint4 v;
  std::memcpy(&v, p, 16);
  return v;
#endif
}

/// Granule at byte g of a `total`-byte buffer (16-byte aligned) into w[0..3]:
/// bytes past the end read as 0 and are never touched.
AKV_QHD void load_granule(const uint8_t* base, int64_t g, int64_t total, uint32_t* w) {
  if (g + 16 <= total) {
    const uint4 v = ldg128(base + g);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    return;
  }
  AKV_UNROLL
  for (int k = 0; k < 4; ++k) {
    uint32_t x = 0;
    for (int b = 0; b < 4; ++b) {
      const int64_t at = g + 4 * k + b;
      if (at < total) x |= uint32_t(base[at]) << (8 * b);
    }
    w[k] = x;
  }
}

/// Bytes [off, off + kBytes) of the matrix at `base` (16-byte aligned,
/// `total` bytes; off even) as words. Aligned: off % 16 == 0 and the tile
/// lies inside the matrix. Otherwise the window of granules around it is
/// read and shifted into place (word select, then a half-word byte_perm).
template <class T, bool kAligned>
AKV_QHD void load_tile(const uint8_t* base, int64_t off, int64_t total, Words<TileOf<T>::kWords>& t) {
  using Ti = TileOf<T>;
  if constexpr (kAligned) {
    static_assert(Ti::kBytes % 16 == 0, "aligned tiles are whole granules");
    uint4 v[Ti::kBytes / 16];
    AKV_UNROLL
    for (int k = 0; k < Ti::kBytes / 16; ++k) v[k] = ldg128(base + off + 16 * k);  // all issued before any use
    AKV_UNROLL
    for (int k = 0; k < Ti::kBytes / 16; ++k) {
      t.w[4 * k] = v[k].x, t.w[4 * k + 1] = v[k].y, t.w[4 * k + 2] = v[k].z, t.w[4 * k + 3] = v[k].w;
    }
  } else {
    constexpr int kW = 4 * Ti::kWindowGranules;
    uint32_t win[kW];
    const int64_t g0 = off & ~int64_t(15);
    AKV_UNROLL
    for (int k = 0; k < Ti::kWindowGranules; ++k) load_granule(base, g0 + 16 * k, total, win + 4 * k);
    const int s = int(off & 15), j = s >> 2;
    uint32_t x[kW];
    AKV_UNROLL
    for (int i = 0; i < kW; ++i) x[i] = (j & 2) ? (i + 2 < kW ? win[i + 2] : 0u) : win[i];
    AKV_UNROLL
    for (int i = 0; i < kW; ++i) x[i] = (j & 1) ? (i + 1 < kW ? x[i + 1] : 0u) : x[i];
    const int half = (s >> 1) & 1;
    AKV_UNROLL
    for (int i = 0; i < Ti::kWords; ++i) t.w[i] = half ? funnel_bytes(x[i], i + 1 < kW ? x[i + 1] : 0u, 2) : x[i];
  }
}

/// Adds the dot of a tile (tile index `tile` of its row, `n_units` of its 8
/// units present) with vector v's int8 x to part[v], unit by unit in order:
/// part += d_x * t_u, with t_u = A * sum(code * q) (+ B * sum q) from integer
/// dot products (raw codes, then kOffset * sum q subtracted exactly); Q6_K:
/// t_u = A_hi * s_hi + A_lo * s_lo over its two 16-element halves.
template <class T, int NV>
AKV_QHD void tile_dot(const Words<TileOf<T>::kWords>& tw, int64_t tile, int n_units, XQuant xq, int64_t cols,
                      float* part) {
  constexpr int N = TileOf<T>::kWords;
  AKV_UNROLL
  for (int u = 0; u < kTileUnits; ++u) {
    if (u >= n_units) break;
    const WordsAt<N> b{&tw, (u / T::kUnits) * T::kBytes};
    const int uu = u % T::kUnits;
    const int64_t xb = tile * kTileUnits + u;
    // Q6_K for few vectors: raw codes, and kOffset * (sum of x over each half)
    // subtracted by dp4a with ones -- the same integers for less work than
    // subtracting kOffset from every code byte (which pays off from 3 vectors).
    constexpr bool kRawHalves = T::kScale16 && NV <= 2;
    uint32_t c[8];
    AKV_UNROLL
    for (int g = 0; g < 8; ++g) {
      if constexpr (T::kScale16 && !kRawHalves) {
        c[g] = codes4<T>(b, uu, g);
      } else {
        c[g] = T::raw4(b, uu, g);
      }
    }
    const float a = T::scale(b, uu, 0);
    float a_hi = 0.f, mn = 0.f;
    if constexpr (T::kScale16) a_hi = T::scale(b, uu, 4);
    if constexpr (T::kHasMin) mn = T::min(b, uu);
    AKV_UNROLL
    for (int v = 0; v < NV; ++v) {
      const int4* xp = reinterpret_cast<const int4*>(xq.qx + v * cols + xb * 32);
      const int4 x0 = ldg(xp), x1 = ldg(xp + 1);
      const float2 d = ldg(xq.ds + v * (cols / 32) + xb);
      const int xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
      float t;
      if constexpr (T::kScale16) {
        int lo = 0, hi = 0;
        AKV_UNROLL
        for (int g = 0; g < 4; ++g) lo = dp4a(int(c[g]), xs[g], lo);
        AKV_UNROLL
        for (int g = 4; g < 8; ++g) hi = dp4a(int(c[g]), xs[g], hi);
        if constexpr (kRawHalves) {
          int sum_lo = 0, sum_hi = 0;
          AKV_UNROLL
          for (int g = 0; g < 4; ++g) sum_lo = dp4a(0x01010101, xs[g], sum_lo);
          AKV_UNROLL
          for (int g = 4; g < 8; ++g) sum_hi = dp4a(0x01010101, xs[g], sum_hi);
          lo -= T::kOffset * sum_lo;
          hi -= T::kOffset * sum_hi;
        }
        t = fmaf(a_hi, float(hi), mul_rn(a, float(lo)));
      } else {
        int s = 0;
        AKV_UNROLL
        for (int g = 0; g < 8; ++g) s = dp4a(int(c[g]), xs[g], s);
        if constexpr (T::kOffset != 0) s -= T::kOffset * int(d.y);  // d.y = sum q, an exact integer
        t = mul_rn(a, float(s));
        if constexpr (T::kHasMin) t = fmaf(mn, d.y, t);
      }
      part[v] = fmaf(d.x, t, part[v]);
    }
  }
}

/// Units of tile `tile` present in a row of `cols` columns (8 but for a
/// partial last tile of a 32-element type).
AKV_QHD int tile_units(int64_t tile, int64_t cols) {
  const int64_t left = cols / 32 - tile * kTileUnits;
  return left < kTileUnits ? int(left) : kTileUnits;
}

}  // namespace activekv::cuda::qtile
