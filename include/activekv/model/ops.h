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
/// angle_i = pos · base^(-2i/rope_dim) for i < rope_dim/2, pairs chosen by
/// c.rope_layout; `base` is the layer's (LayerAttention::rope_base).
/// Angles and sin/cos are computed in double, then rounded to fp32.
void rope(float* x, int T, int n_heads, int head_dim, const int64_t* pos, const ModelConfig& c, float base);

/// gate[t][i] = silu(gate[t][i]) * up[t][i]  (SwiGLU), for T rows of n.
void swiglu(float* gate, const float* up, int T, int n);

/// gate[t][i] = gelu_tanh(gate[t][i]) * up[t][i]  (GeGLU, gemma3), for T rows
/// of n; gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))),
/// PyTorch's gelu(approximate="tanh").
void geglu_tanh(float* gate, const float* up, int T, int n);

/// x[i] *= s for n elements (gemma3's embedding scale).
void scale_inplace(float* x, float s, int64_t n);

/// x[t][i] += bias[i], for T rows of n (the Q/K/V biases of qwen2).
void add_bias(float* x, const float* bias, int T, int n);

/// x[i] += y[i] for n elements.
void add_inplace(float* x, const float* y, int64_t n);

}  // namespace activekv::model
