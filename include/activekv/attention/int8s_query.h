// The int8s query of SPEC §3.3 (and docs/routing.md, "two int8 terms"): the
// one definition the CPU int8s kernels share (attention_int8s.cpp, the
// reference; src/cpu, the decode kernels), so their scores agree.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace activekv::attention {

/// Quantises x[d] to int8 codes with step `a` (round half even, clipped to
/// +-127); a = 0 gives all-zero codes.
[[gnu::always_inline]] inline void quantise_row(const float* x, int d, float a, int8_t* out) {
  for (int j = 0; j < d; ++j) out[j] = a == 0.0f ? 0 : int8_t(std::clamp(std::nearbyint(x[j] / a), -127.0f, 127.0f));
}

/// The channel-scaled query of one page and KV head, as int8 terms.
/// q[d] fp32 (one query head), c[d] the page's key channel scales (fp32).
/// Writes qp[d] = q * c (fp32 scratch), qq[d] = its int8 codes with step
/// a = max|qp| / 127 and, when terms == 2, qq_lo[d] = the codes of the rounding
/// residual qp - a * qq with step a / 127 (residual[d] is scratch). Returns a.
/// Then q . k' ~= a * (qq . kq + (qq_lo . kq) / 127) for key codes kq.
[[gnu::always_inline]] inline float quantise_int8s_query(const float* q, const float* c, int d, int terms, float* qp,
                                                         float* residual, int8_t* qq, int8_t* qq_lo) {
  float qmax = 0.0f;
  for (int j = 0; j < d; ++j) {
    qp[j] = q[j] * c[j];
    qmax = std::max(qmax, std::fabs(qp[j]));
  }
  const float a = qmax / 127.0f;
  quantise_row(qp, d, a, qq);
  if (terms == 2) {
    for (int j = 0; j < d; ++j) residual[j] = qp[j] - a * float(qq[j]);
    quantise_row(residual, d, a / 127.0f, qq_lo);
  }
  return a;
}

}  // namespace activekv::attention
