// Portable CPU decode kernels (the fallback of decode_attention.h): plain C++,
// compiled twice -- for AVX2 and for the baseline -- and chosen at run time
// (no ifunc: the sanitizer builds cannot start with one). Same bits either
// way: every float operation stays per element in source order (no FMA, no
// reordered reduction); integer sums are exact.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "activekv/core/bf16.h"
#include "kernels.h"

namespace activekv::cpu::detail {
namespace {

[[gnu::always_inline]] inline float widen(uint16_t bits) { return bf16_to_f32(bf16{bits}); }

// Softmax of each head's scores [group][n] in place against the row max;
// then o[h] = sum_t p_t * row(t) / l with row(t) widened by `load_row`
// (times `vscale` per channel when given), lse[h] = m + log l.
template <class LoadValue>
[[gnu::always_inline]] inline void softmax_pv(int group, int d, int n, float* scores, const float* vscale,
                                              const LoadValue& value, float* o, float* lse) {
  for (int h = 0; h < group; ++h) {
    float* s = scores + size_t(h) * n;
    float m = s[0];
    for (int t = 1; t < n; ++t) m = std::max(m, s[t]);
    float l = 0.0f;
    for (int t = 0; t < n; ++t) {
      s[t] = std::exp(s[t] - m);
      l += s[t];
    }
    float* oh = o + size_t(h) * d;
    std::fill(oh, oh + d, 0.0f);
    for (int t = 0; t < n; ++t) {
      for (int j = 0; j < d; ++j) oh[j] += s[t] * value(t, j);
    }
    const float inv = 1.0f / l;
    for (int j = 0; j < d; ++j) oh[j] = (vscale ? vscale[j] * oh[j] : oh[j]) * inv;
    lse[h] = m + std::log(l);
  }
}

[[gnu::always_inline]] inline void bf16_item(const Bf16Item& it, int group, int d, float scale, float* scores,
                                             float* o, float* lse) {
  for (int h = 0; h < group; ++h) {
    const float* q = it.q + size_t(h) * d;
    for (int t = 0; t < it.n; ++t) {
      const uint16_t* k = it.k + size_t(t) * d;
      // Eight partial sums, lane j % 8, added in a fixed order: a reduction
      // the compiler can vectorise without reordering any float addition.
      float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int j = 0;
      for (; j + 8 <= d; j += 8)
        for (int l = 0; l < 8; ++l) part[l] += q[j + l] * widen(k[j + l]);
      for (; j < d; ++j) part[0] += q[j] * widen(k[j]);
      const float dot = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
      scores[size_t(h) * it.n + t] = dot * scale;
    }
  }
  softmax_pv(group, d, it.n, scores, nullptr, [&](int t, int j) { return widen(it.v[size_t(t) * d + j]); }, o, lse);
}

[[gnu::always_inline]] inline int32_t dot_i8(const int8_t* a, const int8_t* b, int d) {
  int32_t dot = 0;
  for (int j = 0; j < d; ++j) dot += int32_t(a[j]) * int32_t(b[j]);
  return dot;
}

// Scores exactly as attention_int8s.cpp computes them (the reference).
[[gnu::always_inline]] inline void int8s_scores(const Int8sItem& it, int group, int d, float* scores) {
  for (int h = 0; h < group; ++h) {
    const int8_t* qq = it.qq + size_t(h) * d;
    const int8_t* qq_lo = it.qq_lo + size_t(h) * d;
    for (int t = 0; t < it.n; ++t) {
      const int8_t* k = it.kq + size_t(t) * d;
      float dot = float(dot_i8(qq, k, d));
      if (it.terms == 2) dot += float(dot_i8(qq_lo, k, d)) / 127.0f;
      scores[size_t(h) * it.n + t] = (dot * it.s[t]) * it.row_scale[h];
    }
  }
}

[[gnu::always_inline]] inline void int8s_item(const Int8sItem& it, int group, int d, float* scores, float* o,
                                              float* lse) {
  int8s_scores(it, group, d, scores);
  softmax_pv(group, d, it.n, scores, it.vscale, [&](int t, int j) { return float(it.vq[size_t(t) * d + j]); }, o,
             lse);
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) void bf16_item_avx2(const Bf16Item& it, int group, int d, float scale,
                                                    float* scores, float* o, float* lse) {
  bf16_item(it, group, d, scale, scores, o, lse);
}
__attribute__((target("avx2"))) void int8s_item_avx2(const Int8sItem& it, int group, int d, float* scores, float* o,
                                                     float* lse) {
  int8s_item(it, group, d, scores, o, lse);
}
#endif
void bf16_item_base(const Bf16Item& it, int group, int d, float scale, float* scores, float* o, float* lse) {
  bf16_item(it, group, d, scale, scores, o, lse);
}
void int8s_item_base(const Int8sItem& it, int group, int d, float* scores, float* o, float* lse) {
  int8s_item(it, group, d, scores, o, lse);
}

}  // namespace

Bf16Kernel pick_bf16_portable() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2")) return bf16_item_avx2;
#endif
  return bf16_item_base;
}

void int8s_scores_reference(const Int8sItem& it, int group, int d, float* scores) {
  int8s_scores(it, group, d, scores);
}

Int8sKernel pick_int8s_portable() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2")) return int8s_item_avx2;
#endif
  return int8s_item_base;
}

}  // namespace activekv::cpu::detail
