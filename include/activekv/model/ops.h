// Elementwise and row-wise building blocks of the Llama forward pass (fp32).
// Row-major buffers; T = number of token rows. Parallel over rows with OpenMP.
#pragma once

#include <cstdint>

#include "activekv/model/config.h"

namespace activekv::model {

/// out[t][i] = x[t][i] / sqrt(mean_i x[t][i]^2 + eps) * weight[i], for T rows of n.
/// Sum of squares accumulates in double so the result does not depend on n's
/// blocking; out may alias x.
void rms_norm(const float* x, const float* weight, int T, int n, float eps, float* out);

/// Applies RoPE in place to x [T][n_heads][head_dim] at positions pos[T]:
/// angle_i = pos · base^(-2i/rope_dim) for i < rope_dim/2, pairs chosen by layout.
/// Angles and sin/cos are computed in double, then rounded to fp32.
void rope(float* x, int T, int n_heads, int head_dim, const int64_t* pos, const ModelConfig& c);

/// gate[t][i] = silu(gate[t][i]) * up[t][i]  (SwiGLU), for T rows of n.
void swiglu(float* gate, const float* up, int T, int n);

/// x[t][i] += bias[i], for T rows of n (the Q/K/V biases of qwen2).
void add_bias(float* x, const float* bias, int T, int n);

/// x[i] += y[i] for n elements.
void add_inplace(float* x, const float* y, int64_t n);

}  // namespace activekv::model
