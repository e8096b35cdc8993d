// The prefill attention item (prefill_kernel.h) for CPUs with AVX2 and FMA:
// V is one __m256. Built with -ffp-contract=off (CMakeLists.txt) like the
// portable unit, so every rounding is the one the kernel spells out.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "prefill_item.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma")

#include "prefill_kernel.h"

namespace activekv::cpu::detail {
namespace {

struct Avx2 {
  __m256 v;
  using Mask = __m256;

  static Avx2 load(const float* p) { return {_mm256_loadu_ps(p)}; }
  static void store(float* p, Avx2 a) { _mm256_storeu_ps(p, a.v); }
  static Avx2 set1(float x) { return {_mm256_set1_ps(x)}; }
  static Avx2 zero() { return {_mm256_setzero_ps()}; }
  static Avx2 add(Avx2 a, Avx2 b) { return {_mm256_add_ps(a.v, b.v)}; }
  static Avx2 sub(Avx2 a, Avx2 b) { return {_mm256_sub_ps(a.v, b.v)}; }
  static Avx2 mul(Avx2 a, Avx2 b) { return {_mm256_mul_ps(a.v, b.v)}; }
  // max/min: a > b ? a : b / a < b ? a : b, as the portable V spells them.
  static Avx2 max(Avx2 a, Avx2 b) { return {_mm256_max_ps(a.v, b.v)}; }
  static Avx2 min(Avx2 a, Avx2 b) { return {_mm256_min_ps(a.v, b.v)}; }
  static Avx2 fma(Avx2 a, Avx2 b, Avx2 c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
  static Avx2 floor(Avx2 a) { return {_mm256_floor_ps(a.v)}; }
  static Avx2 pow2i(Avx2 n) {
    const __m256i e = _mm256_add_epi32(_mm256_cvttps_epi32(n.v), _mm256_set1_epi32(127));
    return {_mm256_castsi256_ps(_mm256_slli_epi32(e, 23))};
  }
  static Avx2 widen8(const uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return {_mm256_castsi256_ps(_mm256_slli_epi32(w, 16))};
  }
  static Mask lt(Avx2 a, Avx2 b) { return _mm256_cmp_ps(a.v, b.v, _CMP_LT_OQ); }
  static Mask eq(Avx2 a, Avx2 b) { return _mm256_cmp_ps(a.v, b.v, _CMP_EQ_OQ); }
  static Mask unordered(Avx2 a, Avx2 b) { return _mm256_cmp_ps(a.v, b.v, _CMP_UNORD_Q); }
  static Mask mask_or(Mask a, Mask b) { return _mm256_or_ps(a, b); }
  static Mask between(Avx2 x, Avx2 lo, Avx2 hi) {
    return _mm256_and_ps(_mm256_cmp_ps(lo.v, x.v, _CMP_LE_OQ), _mm256_cmp_ps(x.v, hi.v, _CMP_LE_OQ));
  }
  static Avx2 select(Mask m, Avx2 a, Avx2 b) { return {_mm256_blendv_ps(b.v, a.v, m)}; }
};

}  // namespace

void prefill_item_avx2(const PrefillItem& it) { PrefillKernel<Avx2>(it).run(); }

}  // namespace activekv::cpu::detail

#pragma GCC pop_options
