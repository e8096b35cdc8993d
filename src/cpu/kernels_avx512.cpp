// AVX-512 BF16 / VNNI CPU decode kernels (kernels.h). This translation unit is
// the only one compiled for AVX-512 (the pragma below, after the includes),
// and it uses no C++ library templates, so no AVX-512 code can reach another
// TU through a shared inline instantiation; decode_attention.cpp calls it only
// where cpu_has_avx512_kernels().
//
// Per item (split of n tokens, one KV head, G query heads):
//   pass 1 over K: each key chunk is loaded once into a register and dotted
//     with all G query heads -> scores [G][n]. bf16: two dpbf16 terms per
//     head, a few tokens at a time, so that one reduce16 sums 16
//     accumulators at once. int8s: 16 tokens at a time, their key chunks
//     transposed so that each token has a lane, dpbusd per query term
//     against broadcast query bytes: no horizontal sums;
//   softmax per head against the split's max, exp in AVX-512 (exp512: Cody-
//     Waite reduction, degree-7 polynomial, exact 2^n by scalef; ~1 ulp);
//   pass 2 over V: per block of 16 * NV channels, G x NV fp32 accumulators in
//     registers, each V row block loaded and widened once for the group.
#include <immintrin.h>

#include <cstdint>

#include "kernels.h"

#pragma GCC push_options
// GCC 12's _mm512_reduce_* start from _mm512_undefined_*: a false
// -Wmaybe-uninitialized in every caller.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx512vnni,fma")
#include "transpose16.h"  // after the pragma: compiled for this TU's target

namespace activekv::cpu::detail {
namespace {

inline __m512 exp512(__m512 x) {
  // Inputs are s - max <= 0; below -104 the result is 0 in fp32 anyway.
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);  // ln2 split: exact n*hi
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// Sums of 16 vectors at once (a 4x4 transpose of the partial sums): lane i of
// the result is the sum of the lanes of x[i]. 15 adds and 30 shuffles where
// 16 separate reductions take ~4x as many. The shuffles deliver sum(a[j])
// to lane perm(j), a 4x4 transpose of the index (its own inverse), so the
// input is permuted the same way.
inline __m512 add(__m512 x, __m512 y) { return _mm512_add_ps(x, y); }
inline __m512 reduce16(const __m512* x) {
  using V = __m512;
  V a[16];
  for (int j = 0; j < 16; ++j) a[j] = x[(j % 4) * 4 + j / 4];
  V b[8], c[4], d[2];
  for (int i = 0; i < 8; ++i) {
    b[i] = add((V)(_mm512_shuffle_f32x4((__m512)a[2 * i], (__m512)a[2 * i + 1], 0x44)),
               (V)(_mm512_shuffle_f32x4((__m512)a[2 * i], (__m512)a[2 * i + 1], 0xEE)));
  }
  for (int i = 0; i < 4; ++i) {
    c[i] = add((V)(_mm512_shuffle_f32x4((__m512)b[2 * i], (__m512)b[2 * i + 1], 0x88)),
               (V)(_mm512_shuffle_f32x4((__m512)b[2 * i], (__m512)b[2 * i + 1], 0xDD)));
  }
  for (int i = 0; i < 2; ++i) {
    const __m512d lo = _mm512_unpacklo_pd((__m512d)c[2 * i], (__m512d)c[2 * i + 1]);
    const __m512d hi = _mm512_unpackhi_pd((__m512d)c[2 * i], (__m512d)c[2 * i + 1]);
    d[i] = add((V)lo, (V)hi);
  }
  return add((V)(_mm512_shuffle_ps((__m512)d[0], (__m512)d[1], 0x88)), (V)(_mm512_shuffle_ps((__m512)d[0], (__m512)d[1], 0xDD)));
}

// Softmax of scores[h][0..n) in place (p = exp(s - m)); returns l, sets m.
inline float softmax_row(float* s, int n, float& m_out) {
  __m512 mv = _mm512_set1_ps(-__builtin_inff());
  int t = 0;
  for (; t + 16 <= n; t += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(s + t));
  float m = _mm512_reduce_max_ps(mv);
  for (; t < n; ++t) m = s[t] > m ? s[t] : m;
  const __m512 mb = _mm512_set1_ps(m);
  __m512 lv = _mm512_setzero_ps();
  for (t = 0; t + 16 <= n; t += 16) {
    const __m512 p = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + t), mb));
    _mm512_storeu_ps(s + t, p);
    lv = _mm512_add_ps(lv, p);
  }
  if (t < n) {  // the tail, masked: lanes past n add 0
    const __mmask16 k = __mmask16((1u << (n - t)) - 1u);
    const __m512 p = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + t), mb));
    _mm512_mask_storeu_ps(s + t, k, p);
    lv = _mm512_add_ps(lv, _mm512_maskz_mov_ps(k, p));
  }
  m_out = m;
  return _mm512_reduce_add_ps(lv);
}

}  // namespace

void softmax_rows_avx512(float* scores, int group, int n, float* inv_l, float* lse) {
  for (int h = 0; h < group; ++h) {
    float m;
    const float l = softmax_row(scores + size_t(h) * n, n, m);
    inv_l[h] = 1.0f / l;
    lse[h] = m + __builtin_logf(l);
  }
}

namespace {

// Asks for every cache line of `bytes` bytes at p.
inline void prefetch_bytes(const void* p, int bytes) {
  for (int b = 0; b < bytes; b += 64) _mm_prefetch(static_cast<const char*>(p) + b, _MM_HINT_T0);
}

// Key rows this far ahead of the one being dotted are prefetched.
constexpr int kKeyAhead = 16;

// Widens 16 values of a V row at channel j to fp32; prefetch() asks for all
// cache lines of row t.
struct Bf16Rows {
  const uint16_t* v;
  int d;
  __m512 load(int t, int j) const {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + size_t(t) * d + j));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));  // exact
  }
  void prefetch(int t) const { prefetch_bytes(v + size_t(t) * d, 2 * d); }
};
struct CodeRows {
  const int8_t* v;
  int d;
  __m512 load(int t, int j) const {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v + size_t(t) * d + j));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(raw));  // exact
  }
  void prefetch(int t) const { prefetch_bytes(v + size_t(t) * d, d); }
};

// o[h] = (vscale *) sum_t p[h][t] row(t) / l[h]. Tokens in blocks of kBlock
// (a contiguous stretch of V, kept in L1 while every channel block of
// 16 * NV channels sweeps it with G x NV register accumulators, which carry
// over between token blocks in `o`); the next token block is prefetched
// during the first sweep, so V streams from memory once, in order.
constexpr int kBlock = 32;
template <int G, int NV, class Rows>
inline void pv(const Rows& rows, int n, int d, const float* p, const float* inv_l, const float* vscale, float* o) {
  for (int t0 = 0; t0 < n; t0 += kBlock) {
    const int t1 = t0 + kBlock < n ? t0 + kBlock : n;
    for (int j0 = 0; j0 < d; j0 += 16 * NV) {
      __m512 acc[G][NV];
      for (int h = 0; h < G; ++h)
        for (int i = 0; i < NV; ++i)
          acc[h][i] = t0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(o + size_t(h) * d + j0 + 16 * i);
      for (int t = t0; t < t1; ++t) {
        if (j0 == 0 && t + kBlock < n) rows.prefetch(t + kBlock);
        __m512 v[NV];
        for (int i = 0; i < NV; ++i) v[i] = rows.load(t, j0 + 16 * i);
        for (int h = 0; h < G; ++h) {
          const __m512 pt = _mm512_set1_ps(p[size_t(h) * n + t]);
          for (int i = 0; i < NV; ++i) acc[h][i] = _mm512_fmadd_ps(pt, v[i], acc[h][i]);
        }
      }
      for (int h = 0; h < G; ++h)
        for (int i = 0; i < NV; ++i) _mm512_storeu_ps(o + size_t(h) * d + j0 + 16 * i, acc[h][i]);
    }
  }
  for (int h = 0; h < G; ++h) {
    const __m512 inv = _mm512_set1_ps(inv_l[h]);
    for (int j = 0; j < d; j += 16) {
      __m512 x = _mm512_loadu_ps(o + size_t(h) * d + j);
      if (vscale) x = _mm512_mul_ps(_mm512_loadu_ps(vscale + j), x);
      _mm512_storeu_ps(o + size_t(h) * d + j, _mm512_mul_ps(x, inv));
    }
  }
}

// Softmax per head, then P.V; writes lse.
template <int G, class Rows>
inline void finish(const Rows& rows, int n, int d, float* scores, const float* vscale, float* o, float* lse) {
  float inv_l[G];
  softmax_rows_avx512(scores, G, n, inv_l, lse);
  // Registers: G*NV accumulators + NV row blocks <= 32.
  if constexpr (G <= 6) {
    pv<G, 4>(rows, n, d, scores, inv_l, vscale, o);
  } else {
    pv<G, 2>(rows, n, d, scores, inv_l, vscale, o);
  }
}

// Pass 1 of a bf16 item: scores[h][t] = (q_h . k_t) * scale. TB = 16 / G
// tokens per step, each key chunk loaded once for the G heads; both bf16
// query terms accumulate into one fp32 register per (token, head); one
// reduce16 per step.
template <int G>
void bf16_scores(const Bf16Item& it, int d, float scale, float* scores) {
  constexpr int TB = 16 / G;
  const int nc = d / 32;  // 32 bf16 per register
  alignas(64) float sums[16];
  for (int t0 = 0; t0 < it.n; t0 += TB) {
    const int nt = it.n - t0 < TB ? it.n - t0 : TB;
    for (int tb = 0; tb < nt; ++tb)
      if (t0 + tb + kKeyAhead < it.n) prefetch_bytes(it.k + size_t(t0 + tb + kKeyAhead) * d, 2 * d);
    __m512 acc[16];
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
    for (int c = 0; c < nc; ++c) {
      for (int tb = 0; tb < TB; ++tb) {
        if (tb >= nt) break;
        const __m512bh kc = (__m512bh)_mm512_loadu_si512(it.k + size_t(t0 + tb) * d + 32 * c);
        for (int h = 0; h < G; ++h) {
          __m512& a = acc[tb * G + h];
          a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512(it.q_hi + size_t(h) * d + 32 * c), kc);
          a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512(it.q_lo + size_t(h) * d + 32 * c), kc);
        }
      }
    }
    _mm512_store_ps(sums, reduce16(acc));
    for (int tb = 0; tb < nt; ++tb)
      for (int h = 0; h < G; ++h) scores[size_t(h) * it.n + t0 + tb] = sums[tb * G + h] * scale;
  }
}

template <int G>
void bf16_item(const Bf16Item& it, int d, float scale, float* scores, float* o, float* lse) {
  bf16_scores<G>(it, d, scale, scores);
  finish<G>(Bf16Rows{it.v, d}, it.n, d, scores, nullptr, o, lse);
}

inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return v;
}

// Pass 1 of an int8s item, 16 tokens per step with a token in each lane:
// each 64-byte key chunk of the 16 rows is loaded once and transposed, so
// that register j holds bytes 4j..4j+3 of every token; dpbusd against the
// query's bytes 4j..4j+3 broadcast adds the 4 products into each token's
// lane. The G x TERMS accumulators end with one token per lane: no
// horizontal sums (the earlier layout, one key chunk against whole query
// chunks, took a 16-way reduction per token at G = 6, two terms). dpbusd
// multiplies unsigned by signed bytes: the key codes are flipped to k + 128
// (xor 0x80) and 128 * sum_j q_j is subtracted after; exact in int32. Then the
// reference's float arithmetic (attention_int8s.cpp), lane by lane, so the
// scores are bitwise the reference's (tests/cpu: Int8sScoresAreBitwiseTheReference).
template <int G, int TERMS>
void int8s_scores(const Int8sItem& it, int d, float* scores) {
  const int nc = d / 64;
  int32_t corr[G * TERMS];
  const int8_t* qt[G * TERMS];
  for (int h = 0; h < G; ++h) {
    for (int k = 0; k < TERMS; ++k) {
      const int8_t* qk = (k == 0 ? it.qq : it.qq_lo) + size_t(h) * d;
      int32_t s = 0;
      for (int j = 0; j < d; ++j) s += qk[j];
      corr[h * TERMS + k] = 128 * s;
      qt[h * TERMS + k] = qk;
    }
  }
  const __m512i flip = _mm512_set1_epi8(char(0x80));
  for (int t0 = 0; t0 < it.n; t0 += 16) {
    const int nt = it.n - t0 < 16 ? it.n - t0 : 16;
    const __mmask16 live = nt == 16 ? __mmask16(0xffff) : __mmask16((1u << nt) - 1u);
    for (int r = 0; r < 16; ++r)
      if (t0 + 16 + r < it.n) prefetch_bytes(it.kq + size_t(t0 + 16 + r) * d, d);
    __m512i acc[G * TERMS];
    for (int i = 0; i < G * TERMS; ++i) acc[i] = _mm512_setzero_si512();
    for (int c = 0; c < nc; ++c) {
      __m512i x[16];
      for (int r = 0; r < 16; ++r) {  // rows past the item repeat its last one (lanes never stored)
        const int t = r < nt ? t0 + r : it.n - 1;
        x[r] = _mm512_xor_si512(_mm512_loadu_si512(it.kq + size_t(t) * d + 64 * c), flip);
      }
      transpose16(x);
      for (int j = 0; j < 16; ++j)
        for (int i = 0; i < G * TERMS; ++i)
          acc[i] = _mm512_dpbusd_epi32(acc[i], x[j], _mm512_set1_epi32(load_i32(qt[i] + 64 * c + 4 * j)));
    }
    const __m512 tok = _mm512_maskz_loadu_ps(live, it.s + t0);
    for (int h = 0; h < G; ++h) {
      const int i = h * TERMS;
      __m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i], _mm512_set1_epi32(corr[i])));
      if constexpr (TERMS == 2) {
        const __m512 lo = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i + 1], _mm512_set1_epi32(corr[i + 1])));
        dot = _mm512_add_ps(dot, _mm512_div_ps(lo, _mm512_set1_ps(127.0f)));
      }
      const __m512 sc = _mm512_mul_ps(_mm512_mul_ps(dot, tok), _mm512_set1_ps(it.row_scale[h]));
      _mm512_mask_storeu_ps(scores + size_t(h) * it.n + t0, live, sc);
    }
  }
}

template <int G>
void int8s_item(const Int8sItem& it, int d, float* scores, float* o, float* lse) {
  if (it.terms == 2) {
    int8s_scores<G, 2>(it, d, scores);
  } else {
    int8s_scores<G, 1>(it, d, scores);
  }
  finish<G>(CodeRows{it.vq, d}, it.n, d, scores, it.vscale, o, lse);
}

}  // namespace

void bf16_item_avx512(const Bf16Item& it, int group, int d, float scale, float* scores, float* o, float* lse) {
  switch (group) {
    case 1: return bf16_item<1>(it, d, scale, scores, o, lse);
    case 2: return bf16_item<2>(it, d, scale, scores, o, lse);
    case 3: return bf16_item<3>(it, d, scale, scores, o, lse);
    case 4: return bf16_item<4>(it, d, scale, scores, o, lse);
    case 5: return bf16_item<5>(it, d, scale, scores, o, lse);
    case 6: return bf16_item<6>(it, d, scale, scores, o, lse);
    case 7: return bf16_item<7>(it, d, scale, scores, o, lse);
    default: return bf16_item<8>(it, d, scale, scores, o, lse);
  }
}

void int8s_scores_avx512(const Int8sItem& it, int group, int d, float* scores) {
  auto run = [&]<int G>() {
    if (it.terms == 2) int8s_scores<G, 2>(it, d, scores);
    else int8s_scores<G, 1>(it, d, scores);
  };
  switch (group) {
    case 1: return run.template operator()<1>();
    case 2: return run.template operator()<2>();
    case 3: return run.template operator()<3>();
    case 4: return run.template operator()<4>();
    case 5: return run.template operator()<5>();
    case 6: return run.template operator()<6>();
    case 7: return run.template operator()<7>();
    default: return run.template operator()<8>();
  }
}

void int8s_item_avx512(const Int8sItem& it, int group, int d, float* scores, float* o, float* lse) {
  switch (group) {
    case 1: return int8s_item<1>(it, d, scores, o, lse);
    case 2: return int8s_item<2>(it, d, scores, o, lse);
    case 3: return int8s_item<3>(it, d, scores, o, lse);
    case 4: return int8s_item<4>(it, d, scores, o, lse);
    case 5: return int8s_item<5>(it, d, scores, o, lse);
    case 6: return int8s_item<6>(it, d, scores, o, lse);
    case 7: return int8s_item<7>(it, d, scores, o, lse);
    default: return int8s_item<8>(it, d, scores, o, lse);
  }
}

}  // namespace activekv::cpu::detail

#pragma GCC pop_options
