// Internal: the CPU prefill attention item (prefill_item.h) written once over
// an 8-lane float vector type V and instantiated twice: AVX2 + FMA
// (prefill_kernel_avx2.cpp, V wraps __m256) and portable C++
// (prefill_kernel_portable.cpp, V is eight floats and std::fma). Every
// operation is per lane and in the same order in both, no horizontal
// reduction anywhere (the lanes are head rows or channels), and both
// translation units are built with -ffp-contract=off, so the two give the
// same bits.
//
// Only a template here: the AVX2 unit includes this file after its target
// pragma and prefill_item.h (plain inline functions) before it, so nothing
// compiled for AVX2 can be shared with code built for the baseline.
#pragma once

#include "prefill_item.h"

namespace activekv::cpu::detail {

// The kernel, over V: load/store (unaligned), set1, zero, add, sub, mul, max,
// min, fma(a, b, c) = a * b + c rounded once, floor, pow2i (2^n for integral
// n in [-127, 128]), widen8 (eight bf16 bits -> fp32), and masks: lt, between
// (lo <= x <= hi), eq, unordered (either is NaN), mask_or, select(mask, a, b).

template <class V>
struct PrefillKernel {
  static constexpr int KB = kPrefillKeyBlock;
  static constexpr float kNegInf = -__builtin_inff();

  // e^x; 0 below -87 (-inf included), where it would be subnormal.
  static V exp(V x) {
    const V xc = V::min(V::max(x, V::set1(-88.0f)), V::set1(88.0f));
    const V n = V::floor(V::add(V::mul(xc, V::set1(1.44269504088896341f)), V::set1(0.5f)));
    V r = V::fma(n, V::set1(-0.693359375f), xc);  // x - n ln 2, ln 2 in two parts
    r = V::fma(n, V::set1(2.12194440e-4f), r);
    V p = V::set1(1.9875691500e-4f);
    p = V::fma(p, r, V::set1(1.3981999507e-3f));
    p = V::fma(p, r, V::set1(8.3334519073e-3f));
    p = V::fma(p, r, V::set1(4.1665795894e-2f));
    p = V::fma(p, r, V::set1(1.6666665459e-1f));
    p = V::fma(p, r, V::set1(5.0000001201e-1f));
    const V y = V::add(V::fma(p, V::mul(r, r), r), V::set1(1.0f));
    return V::select(V::lt(x, V::set1(-87.0f)), V::zero(), V::mul(y, V::pow2i(n)));
  }

  const PrefillItem& it;
  int d, G, M, Mp;
  float *qt, *kf, *vf, *st, *acc, *m, *l, *alpha, *lo, *hi;

  explicit PrefillKernel(const PrefillItem& item) : it(item) {
    d = it.d;
    G = it.group;
    M = it.n_rows * G;
    Mp = prefill_padded_rows(M);
    const PrefillScratch s = prefill_scratch(M, d);
    qt = it.scratch + s.qt;
    kf = it.scratch + s.kf;
    vf = it.scratch + s.vf;
    st = it.scratch + s.st;
    acc = it.scratch + s.acc;
    m = it.scratch + s.m;
    l = it.scratch + s.l;
    alpha = it.scratch + s.alpha;
    lo = it.scratch + s.lo;
    hi = it.scratch + s.hi;
  }

  void run() {
    for (int j = 0; j < d; ++j) {
      for (int i = 0; i < Mp; ++i) qt[size_t(j) * Mp + i] = i < M ? it.q[size_t(i / G) * it.q_stride + size_t(i % G) * d + j] : 0.0f;
    }
    for (int i = 0; i < Mp; ++i) {
      m[i] = kNegInf;
      l[i] = 0.0f;
    }
    for (size_t i = 0; i < size_t(Mp) * d; ++i) acc[i] = 0.0f;
    for (int p = 0; p < it.n_pages; ++p) {
      for (int b0 = 0; b0 < it.page_tokens[p]; b0 += KB) {
        const int nk = it.page_tokens[p] - b0 < KB ? it.page_tokens[p] - b0 : KB;
        block(it.k[p] + size_t(b0) * d, it.v[p] + size_t(b0) * d, nk,
              it.first_token + int64_t(p) * it.page_size + b0);
      }
    }
  }

  // Keys [t0, t0 + nk) of the item's history.
  void block(const uint16_t* k, const uint16_t* v, int nk, int64_t t0) {
    // Each row's visible keys in this block, block-local [lo, hi] (lo > hi: none).
    int i_lo = Mp, i_hi = 0, t_end = 0;
    for (int r = 0; r < it.n_rows; ++r) {
      const int64_t pos = it.positions[r];
      const int64_t first = it.window > 0 ? pos - it.window + 1 - t0 : 0;
      const int64_t f = first > 0 ? first : 0;
      const int64_t e = pos - t0 < nk - 1 ? pos - t0 : nk - 1;
      const bool sees = f <= e;
      for (int h = 0; h < G; ++h) {
        lo[r * G + h] = sees ? float(f) : 1.0f;
        hi[r * G + h] = sees ? float(e) : 0.0f;
      }
      if (!sees) continue;
      i_lo = i_lo < r * G ? i_lo : r * G;
      i_hi = i_hi > r * G + G ? i_hi : r * G + G;
      t_end = t_end > int(e) + 1 ? t_end : int(e) + 1;
    }
    if (t_end == 0) return;  // no row sees the block: not even read
    for (int i = M; i < Mp; ++i) {
      lo[i] = 1.0f;
      hi[i] = 0.0f;
    }
    const int c_lo = i_lo / kPrefillTile * kPrefillTile, c_hi = prefill_padded_rows(i_hi);
    const int nt = (t_end + 3) / 4 * 4;
    widen_rows(k, t_end, nt, kf);
    widen_rows(v, t_end, t_end, vf);
    scores(c_lo, c_hi, nt);
    softmax(c_lo, c_hi, t_end);
    pv(c_lo, c_hi, t_end);
  }

  // Rows [0, n) of a plane to fp32 [n][d]; rows [n, n_padded) zero.
  void widen_rows(const uint16_t* src, int n, int n_padded, float* dst) {
    for (int t = 0; t < n; ++t) {
      for (int j = 0; j < d; j += 8) V::store(dst + size_t(t) * d + j, V::widen8(src + size_t(t) * d + j));
    }
    for (int t = n; t < n_padded; ++t) {
      for (int j = 0; j < d; j += 8) V::store(dst + size_t(t) * d + j, V::zero());
    }
  }

  // st[t][i] = scale * sum_j k_t[j] q_i[j] for keys t < nt, head rows [c_lo, c_hi).
  void scores(int c_lo, int c_hi, int nt) {
    const V scale = V::set1(it.scale);
    for (int t = 0; t < nt; t += 4) {
      const float* k0 = kf + size_t(t) * d;
      for (int c = c_lo; c < c_hi; c += kPrefillTile) {
        V a[4][2];
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) a[u][0] = a[u][1] = V::zero();
        const float* qc = qt + c;
        for (int j = 0; j < d; ++j) {
          const V q0 = V::load(qc + size_t(j) * Mp), q1 = V::load(qc + size_t(j) * Mp + 8);
#pragma GCC unroll 4
          for (int u = 0; u < 4; ++u) {
            const V kb = V::set1(k0[size_t(u) * d + j]);
            a[u][0] = V::fma(kb, q0, a[u][0]);
            a[u][1] = V::fma(kb, q1, a[u][1]);
          }
        }
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) {
          V::store(st + size_t(t + u) * Mp + c, V::mul(a[u][0], scale));
          V::store(st + size_t(t + u) * Mp + c + 8, V::mul(a[u][1], scale));
        }
      }
    }
  }

  // Online softmax over keys [0, t_end) of the block, eight head rows a vector:
  // st becomes p (0 where a row cannot see the key); m, l, alpha updated. A
  // visible NaN or +inf score makes the row's l NaN, for good (l * alpha + sum
  // stays NaN): its O and LSE come out NaN, as attend_tile's do -- not the
  // finite or empty row the max and exp would otherwise leave.
  void softmax(int c_lo, int c_hi, int t_end) {
    const V neg_inf = V::set1(kNegInf), pos_inf = V::set1(-kNegInf);
    for (int c = c_lo; c < c_hi; c += 8) {
      const V vlo = V::load(lo + c), vhi = V::load(hi + c);
      V mx = neg_inf;
      auto bad = V::eq(neg_inf, pos_inf);  // all false
      for (int t = 0; t < t_end; ++t) {
        float* s = st + size_t(t) * Mp + c;
        const V x = V::select(V::between(V::set1(float(t)), vlo, vhi), V::load(s), neg_inf);
        V::store(s, x);
        mx = V::max(mx, x);
        bad = V::mask_or(bad, V::mask_or(V::unordered(x, x), V::eq(x, pos_inf)));
      }
      const V m_old = V::load(m + c);
      const V m_new = V::max(m_old, mx);
      // Rescale of the old state: 0 if it was empty, 1 if the row still saw nothing.
      const V a = V::select(V::eq(m_new, neg_inf), V::set1(1.0f),
                            V::select(V::eq(m_old, neg_inf), V::zero(), exp(V::sub(m_old, m_new))));
      V sum = V::zero();
      for (int t = 0; t < t_end; ++t) {
        float* s = st + size_t(t) * Mp + c;
        const V x = V::load(s);
        const V p = V::select(V::eq(x, neg_inf), V::zero(), exp(V::sub(x, m_new)));
        V::store(s, p);
        sum = V::add(sum, p);
      }
      V::store(l + c, V::select(bad, V::set1(__builtin_nanf("")), V::add(V::mul(V::load(l + c), a), sum)));
      V::store(m + c, m_new);
      V::store(alpha + c, a);
    }
  }

  // acc[i] = acc[i] * alpha[i] + sum_t p[t][i] v_t for head rows [c_lo, c_hi):
  // the block's sum from zero first (a long history's accumulator then takes
  // one rounding per block, not per key: ~3x less error over 1K keys).
  void pv(int c_lo, int c_hi, int t_end) {
    for (int i = c_lo; i < c_hi; i += 4) {
      for (int j = 0; j < d; j += kPrefillTile) {
        V a[4][2];
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) a[u][0] = a[u][1] = V::zero();
        for (int t = 0; t < t_end; ++t) {
          const V v0 = V::load(vf + size_t(t) * d + j), v1 = V::load(vf + size_t(t) * d + j + 8);
          const float* p = st + size_t(t) * Mp + i;
#pragma GCC unroll 4
          for (int u = 0; u < 4; ++u) {
            const V pb = V::set1(p[u]);
            a[u][0] = V::fma(pb, v0, a[u][0]);
            a[u][1] = V::fma(pb, v1, a[u][1]);
          }
        }
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) {
          const V s = V::set1(alpha[i + u]);
          float* row = acc + size_t(i + u) * d + j;
          V::store(row, V::fma(V::load(row), s, a[u][0]));
          V::store(row + 8, V::fma(V::load(row + 8), s, a[u][1]));
        }
      }
    }
  }
};

}  // namespace activekv::cpu::detail
