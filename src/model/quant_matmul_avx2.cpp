// The fused kernel of quant_matmul.h for CPUs with AVX2, FMA and F16C. Each
// 32-element unit (a block, or a K-quant sub-block) is decoded in registers
// to the fp32 weights gguf::dequantize gives,
// then two x rows at a time take 4 fused multiply-adds each into their 4 x 8
// lanes. The decode's products are exact in fp32 (a code of at most 8 bits
// times a half's 11-bit significand), so Q4_1's q * d + m rounds once whether
// or not the compiler contracts it into an FMA, as gguf::dequantize's does.
#include <immintrin.h>

#include <cstring>

#include "quant_matmul_kernels.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace activekv::model::detail {
namespace {

float half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);  // exact for every finite half (a signalling NaN comes back quiet)
}

__m256 widen_u8(__m128i bytes8) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes8)); }

// The low and high 8 bytes of each 16-byte half of `v` (bytes 8k .. 8k + 7 in part[k]).
void quarters(__m256i v, __m128i part[4]) {
  const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
  part[0] = lo;
  part[1] = _mm_unpackhi_epi64(lo, lo);
  part[2] = hi;
  part[3] = _mm_unpackhi_epi64(hi, hi);
}

// Q4_K / Q5_K's 6-bit scale and min of sub-block j (gguf's scale_min_k4).
void scale_min_k4(int j, const uint8_t* q, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Unit u of a row's 32 weights as 4 x 8 floats, elements 8k .. 8k + 7 in
// w[k], each the value gguf::dequantize gives: the same products in the same
// order. Exact products need no care (Q4_K's d * sc and d1 * q, Q6_K's
// d * sc); Q6_K's (d * sc) * q rounds, once, as gguf's does.
template <BlockType T>
__attribute__((always_inline)) inline void decode(const uint8_t* row, int64_t u, __m256 w[4]) {
  if constexpr (T == BlockType::q8_0) {
    const uint8_t* p = row + size_t(u) * block_bytes(T);
    const __m256 d = _mm256_set1_ps(half(p));
    for (int k = 0; k < 4; ++k) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 2 + 8 * k));
      w[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
    }
  } else if constexpr (T == BlockType::q5_0) {
    // Codes in element order: 16 low nibbles then 16 high ones, OR'd with
    // element e's fifth bit -- bit e of the little-endian word at p + 2 --
    // spread to byte e (byte k of the word to bytes 8k..8k+7, one bit each).
    const uint8_t* p = row + size_t(u) * block_bytes(T);
    uint32_t qh;
    std::memcpy(&qh, p + 2, 4);
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 6));
    const __m128i nib = _mm_set1_epi8(0x0f);
    const __m256i low = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), nib), _mm_and_si128(qs, nib));
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(int(qh)),
                                               _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2,
                                                                2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201));
    const __m256i top = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(16));
    const __m256i codes = _mm256_sub_epi8(_mm256_or_si256(low, top), _mm256_set1_epi8(16));  // -16..15
    __m128i part[4];
    quarters(codes, part);
    const __m256 d = _mm256_set1_ps(half(p));
    for (int k = 0; k < 4; ++k) w[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part[k])), d);
  } else if constexpr (T == BlockType::q4_0 || T == BlockType::q4_1) {
    const uint8_t* p = row + size_t(u) * block_bytes(T);
    constexpr int codes = T == BlockType::q4_1 ? 4 : 2;
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + codes));
    const __m128i nib = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(qs, nib), hi = _mm_and_si128(_mm_srli_epi16(qs, 4), nib);
    const __m128i part[4] = {lo, _mm_unpackhi_epi64(lo, lo), hi, _mm_unpackhi_epi64(hi, hi)};
    const __m256 d = _mm256_set1_ps(half(p));
    if constexpr (T == BlockType::q4_1) {
      const __m256 m = _mm256_set1_ps(half(p + 2));
      for (int k = 0; k < 4; ++k) w[k] = _mm256_add_ps(_mm256_mul_ps(widen_u8(part[k]), d), m);
    } else {
      const __m256i eight = _mm256_set1_epi32(8);
      for (int k = 0; k < 4; ++k)
        w[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(part[k]), eight)), d);
    }
  } else if constexpr (T == BlockType::q4_k) {
    // Super-block: f16 d, f16 dmin, 12 scale bytes, 128 code bytes; sub-block
    // j takes the low (j even) or high nibbles of code bytes 32 (j / 2) ..
    const uint8_t* p = row + size_t(u / 8) * block_bytes(T);
    const int j = int(u % 8);
    int sc, m;
    scale_min_k4(j, p + 4, sc, m);
    const float d1 = half(p) * float(sc), m1 = half(p + 2) * float(m);
    const __m256i q32 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 + 32 * (j / 2)));
    const __m256i nib = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(q32, 4) : q32, _mm256_set1_epi8(0x0f));
    __m128i part[4];
    quarters(nib, part);
    const __m256 vd = _mm256_set1_ps(d1), vm = _mm256_set1_ps(m1);
    for (int k = 0; k < 4; ++k) w[k] = _mm256_fmsub_ps(widen_u8(part[k]), vd, vm);  // exact product, one rounding
  } else {
    static_assert(T == BlockType::q6_k);
    // Super-block: 128 low-nibble bytes, 64 bytes of top bits, 16 int8 scales,
    // f16 d. Unit u: half h = u / 4 (128 elements), quarter qt = u % 4 --
    // nibbles of ql bytes 64 h + 32 (qt & 1) .. (high ones for qt >= 2), top
    // bits 2 qt of qh bytes 32 h .., scales 8 h + 2 qt (elements 0-15) and + 1.
    const uint8_t* p = row + size_t(u / 8) * block_bytes(T);
    const int h = int(u % 8) / 4, qt = int(u % 4);
    const __m256i l = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * h + 32 * (qt & 1)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * h));
    const __m256i low = _mm256_and_si256(qt >= 2 ? _mm256_srli_epi16(l, 4) : l, _mm256_set1_epi8(0x0f));
    const __m256i top = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * qt)), _mm256_set1_epi8(3));
    const __m256i codes = _mm256_or_si256(low, _mm256_slli_epi16(top, 4));  // 0..63 per byte
    __m128i part[4];
    quarters(codes, part);
    const auto* sc = reinterpret_cast<const int8_t*>(p + 192 + 8 * h + 2 * qt);
    const float d = half(p + 208);
    const __m256 ds[2] = {_mm256_set1_ps(d * float(sc[0])), _mm256_set1_ps(d * float(sc[1]))};
    const __m256i off = _mm256_set1_epi32(32);
    for (int k = 0; k < 4; ++k)
      w[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(part[k]), off)), ds[k / 2]);
  }
}

// ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)) of s = (a0 + a1) + (a2 + a3).
float lanes_sum(const __m256 a[4]) {
  const __m256 s = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
  const __m128 u = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  const __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));
  return _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps(v, v, 1)));
}

// G (1 or 2) x rows from t0 against row r.
template <BlockType T, int G>
void dot_rows(const FusedRows& f, int64_t r, int t0) {
  const uint8_t* row = f.w + size_t(r) * f.row_bytes;
  __m256 acc[G][4];
  for (int g = 0; g < G; ++g)
    for (int k = 0; k < 4; ++k) acc[g][k] = _mm256_setzero_ps();
  const int64_t units = f.cols / 32;
  for (int64_t b = 0; b < units; ++b) {
    __m256 w[4];
    decode<T>(row, b, w);
    for (int g = 0; g < G; ++g) {
      const float* x = f.x + size_t(t0 + g) * size_t(f.cols) + size_t(b) * 32;
      for (int k = 0; k < 4; ++k) acc[g][k] = _mm256_fmadd_ps(w[k], _mm256_loadu_ps(x + 8 * k), acc[g][k]);
    }
  }
  for (int g = 0; g < G; ++g) f.y[size_t(t0 + g) * size_t(f.ldy) + size_t(r)] = lanes_sum(acc[g]);
}

template <BlockType T>
void rows(const FusedRows& f, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    int t = 0;
    for (; t + 2 <= f.n; t += 2) dot_rows<T, 2>(f, r, t);
    if (t < f.n) dot_rows<T, 1>(f, r, t);
  }
}

template <BlockType T>
void dequantize(const FusedRows& f, int64_t r0, int64_t r1, float* out) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = f.w + size_t(r) * f.row_bytes;
    float* o = out + size_t(r - r0) * size_t(f.cols);
    for (int64_t b = 0; b < f.cols / 32; ++b) {
      __m256 w[4];
      decode<T>(row, b, w);
      for (int k = 0; k < 4; ++k) _mm256_storeu_ps(o + size_t(b) * 32 + 8 * k, w[k]);
    }
  }
}

}  // namespace

void dequantize_rows_avx2(const FusedRows& f, int64_t r0, int64_t r1, float* out) {
  switch (f.type) {
    case BlockType::q4_0: dequantize<BlockType::q4_0>(f, r0, r1, out); return;
    case BlockType::q4_1: dequantize<BlockType::q4_1>(f, r0, r1, out); return;
    case BlockType::q8_0: dequantize<BlockType::q8_0>(f, r0, r1, out); return;
    case BlockType::q5_0: dequantize<BlockType::q5_0>(f, r0, r1, out); return;
    case BlockType::q4_k: dequantize<BlockType::q4_k>(f, r0, r1, out); return;
    case BlockType::q6_k: dequantize<BlockType::q6_k>(f, r0, r1, out); return;
  }
}

void fused_rows_avx2(const FusedRows& f, int64_t r0, int64_t r1) {
  switch (f.type) {
    case BlockType::q4_0: rows<BlockType::q4_0>(f, r0, r1); return;
    case BlockType::q4_1: rows<BlockType::q4_1>(f, r0, r1); return;
    case BlockType::q8_0: rows<BlockType::q8_0>(f, r0, r1); return;
    case BlockType::q5_0: rows<BlockType::q5_0>(f, r0, r1); return;
    case BlockType::q4_k: rows<BlockType::q4_k>(f, r0, r1); return;
    case BlockType::q6_k: rows<BlockType::q6_k>(f, r0, r1); return;
  }
}

}  // namespace activekv::model::detail

#pragma GCC pop_options
