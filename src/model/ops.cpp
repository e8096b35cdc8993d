#include "activekv/model/ops.h"

#include <cmath>

namespace activekv::model {

void rms_norm(const float* x, const float* weight, int T, int n, float eps, float* out) {
#pragma omp parallel for schedule(static) if (T > 1)
  for (int t = 0; t < T; ++t) {
    const float* xr = x + size_t(t) * n;
    double ss = 0.0;
    for (int i = 0; i < n; ++i) ss += double(xr[i]) * double(xr[i]);
    const float inv = float(1.0 / std::sqrt(ss / n + double(eps)));
    float* o = out + size_t(t) * n;
    for (int i = 0; i < n; ++i) o[i] = xr[i] * inv * weight[i];
  }
}

void rope(float* x, int T, int n_heads, int head_dim, const int64_t* pos, const ModelConfig& c, float base) {
  const int half = c.rope_dim / 2;
#pragma omp parallel for schedule(static) if (T > 1)
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < half; ++i) {
      const double freq = std::pow(double(base), -2.0 * i / double(c.rope_dim));
      const double angle = double(pos[t]) * freq;
      const float cs = float(std::cos(angle)), sn = float(std::sin(angle));
      const int a = c.rope_layout == RopeLayout::Interleaved ? 2 * i : i;
      const int b = c.rope_layout == RopeLayout::Interleaved ? 2 * i + 1 : i + half;
      for (int h = 0; h < n_heads; ++h) {
        float* v = x + (size_t(t) * n_heads + h) * head_dim;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * cs - x1 * sn;
        v[b] = x0 * sn + x1 * cs;
      }
    }
  }
}

void swiglu(float* gate, const float* up, int T, int n) {
  const int64_t total = int64_t(T) * n;
#pragma omp parallel for schedule(static) if (total > 16384)
  for (int64_t i = 0; i < total; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void geglu_tanh(float* gate, const float* up, int T, int n) {
  const int64_t total = int64_t(T) * n;
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
#pragma omp parallel for schedule(static) if (total > 16384)
  for (int64_t i = 0; i < total; ++i) {
    const float g = gate[i];
    gate[i] = 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * (g + 0.044715f * g * g * g))) * up[i];
  }
}

void scale_inplace(float* x, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void add_bias(float* x, const float* bias, int T, int n) {
  for (int t = 0; t < T; ++t) add_inplace(x + size_t(t) * n, bias, n);
}

void add_inplace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

}  // namespace activekv::model
