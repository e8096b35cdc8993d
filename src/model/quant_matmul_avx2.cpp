// The fused kernel of quant_matmul.h for CPUs with AVX2, FMA and F16C. Each
// block is decoded in registers to the fp32 weights gguf::dequantize gives,
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

// The block's 32 weights as 4 x 8 floats, elements 8k .. 8k + 7 in w[k].
template <BlockType T>
void decode(const uint8_t* p, __m256 w[4]) {
  if constexpr (T == BlockType::q8_0) {
    const __m256 d = _mm256_set1_ps(half(p));
    for (int k = 0; k < 4; ++k) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 2 + 8 * k));
      w[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
    }
  } else {
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
  }
}

constexpr size_t block_bytes(BlockType t) { return t == BlockType::q4_0 ? 18 : t == BlockType::q4_1 ? 20 : 34; }

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
  const int64_t blocks = f.cols / 32;
  for (int64_t b = 0; b < blocks; ++b) {
    __m256 w[4];
    decode<T>(row + size_t(b) * block_bytes(T), w);
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
      decode<T>(row + size_t(b) * block_bytes(T), w);
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
  }
}

void fused_rows_avx2(const FusedRows& f, int64_t r0, int64_t r1) {
  switch (f.type) {
    case BlockType::q4_0: rows<BlockType::q4_0>(f, r0, r1); return;
    case BlockType::q4_1: rows<BlockType::q4_1>(f, r0, r1); return;
    case BlockType::q8_0: rows<BlockType::q8_0>(f, r0, r1); return;
  }
}

}  // namespace activekv::model::detail

#pragma GCC pop_options
