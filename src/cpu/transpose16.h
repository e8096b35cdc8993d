// Internal: a 16x16 transpose of 32-bit elements in AVX-512 registers, for
// the CPU decode kernels (kernels_avx512.cpp, kernels_amx.cpp). Include it
// after a TU's `#pragma GCC target` that enables AVX-512F: the function has
// internal linkage, so each TU gets its own copy compiled for its target and
// no AVX-512 code reaches another TU through a shared inline definition.
#pragma once

#include <immintrin.h>

namespace activekv::cpu::detail {
namespace {

// 16x16 transpose of 32-bit elements: on return x[j] lane r = x[r] lane j
// (as given). Within 128-bit lanes (unpack 32 then 64), then across them (a
// 4x4 transpose of the 128-bit lanes of each group of four).
inline void transpose16(__m512i (&x)[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(x[2 * i], x[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(x[2 * i], x[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // u[4i + e]: element 4L + e of rows 4i..4i+3, in 128-bit lane L
    u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int e = 0; e < 4; ++e) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0x44), v1 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0xEE);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0x44);
    const __m512i v3 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0xEE);
    x[e] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    x[4 + e] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
    x[8 + e] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    x[12 + e] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
  }
}

}  // namespace
}  // namespace activekv::cpu::detail
