// Elementwise and row-wise building blocks of the Llama-family forward pass
// on the GPU: the device twins of activekv/model/ops.h (the CPU reference),
// plus what Qwen2 and Gemma 3 add (bias, GeGLU, embedding scale) and the
// f32 -> bf16 cast in front of the bf16 GEMMs.
//
// Buffers are fp32 in device memory, row-major [T][n] (T = token rows).
// Every call is asynchronous on `stream` and launches one kernel; nothing is
// synchronised. Argument errors throw activekv::InvalidArgument naming the
// argument, launch errors activekv::cuda::CudaError. Sizes of 0 are no-ops.
//
// Agreement with the CPU (tests/cuda/test_model_ops.cpp measures it): each op
// does the CPU's arithmetic in the CPU's order with fp32 operations that are
// never contracted into FMAs, so it matches bit for bit except where an
// intermediate rounds differently: the order of a double sum (rms_norm) or
// CUDA's double sin/cos against glibc's (rope), estimated at ~1e-8 per value;
// and exp in swiglu, where glibc's expf is not correctly rounded for ~6e-4 of
// arguments (simulated on the CPU: 2.5e-4 of outputs differ, by <= 6 ulp).
// The error analysis is at each test.
#pragma once

#include <cstdint>
#include <memory>

#include "activekv/model/config.h"

typedef struct CUstream_st* cudaStream_t;

namespace activekv::cuda {

struct DevBuf;

/// out[t][i] = x[t][i] * inv_t * weight[i] with inv_t = 1 / sqrt(mean_i
/// x[t][i]^2 + eps): x, out [T][n], weight [n]. As model::rms_norm: the sum of
/// squares in double, inv_t in double rounded to fp32, then (x * inv_t) * w in
/// fp32. Only the double sum's order differs from the CPU. out may alias x.
/// weight is read before the programmatic wait (launch.h): it must not be
/// written by the kernel launched just before on this stream.
void rms_norm(const float* x, const float* weight, int T, int n, float eps, float* out, cudaStream_t stream);

/// RoPE frequencies freq_i = base^(-2i/rope_dim), i < rope_dim/2, computed
/// once on the host with the CPU's own expression (std::pow in double, as
/// model::rope) and kept on the device: CUDA's pow is off by up to 2 ulp, which
/// near position 10^5 would change the rounded fp32 cos/sin of the fast pairs
/// in a few values per 10^4; with the host's table they agree but for ~10^-8.
/// Owns device memory on the current GPU; movable, not copyable.
class RopeFreqs {
 public:
  /// Throws InvalidArgument if rope_dim is not positive and even or base is not
  /// finite and > 0; CudaError if the upload fails (synchronous).
  RopeFreqs(int rope_dim, float base, model::RopeLayout layout);
  explicit RopeFreqs(const model::ModelConfig& c) : RopeFreqs(c.rope_dim, c.rope_base, c.rope_layout) {}
  ~RopeFreqs();
  RopeFreqs(RopeFreqs&&) noexcept;
  RopeFreqs& operator=(RopeFreqs&&) noexcept;

  int rope_dim() const { return rope_dim_; }
  model::RopeLayout layout() const { return layout_; }
  /// rope_dim/2 doubles on the device.
  const double* freqs() const;

 private:
  int rope_dim_ = 0;
  model::RopeLayout layout_ = model::RopeLayout::Interleaved;
  std::unique_ptr<DevBuf> freqs_;
};

/// Rotates x [T][n_heads][head_dim] in place at positions pos [T] (device
/// int64): angle = pos[t] * freq_i in double, cos/sin in double rounded to
/// fp32, the pairs (2i, 2i+1) (Interleaved) or (i, i + rope_dim/2) (HalfSplit,
/// NeoX) rotated as x0*c - x1*s, x0*s + x1*c in fp32, as model::rope. Channels
/// from rope_dim on are left alone. Throws InvalidArgument if
/// rope_dim > head_dim.
void rope(float* x, int T, int n_heads, int head_dim, const int64_t* pos, const RopeFreqs& freqs,
          cudaStream_t stream);

/// rope(q, T, n_heads, ...) and rope(k, T, n_kv_heads, ...) in one launch,
/// bitwise the same (one thread rotates a pair of q's heads and of k's):
/// q [T][n_heads][head_dim], k [T][n_kv_heads][head_dim]. Errors as rope.
void rope_qk(float* q, int n_heads, float* k, int n_kv_heads, int T, int head_dim, const int64_t* pos,
             const RopeFreqs& freqs, cudaStream_t stream);

/// gate[i] = silu(gate[i]) * up[i] = gate / (1 + exp(-gate)) * up over n
/// elements (SwiGLU, as model::swiglu; exp in double rounded to fp32, i.e.
/// a correctly rounded expf but for ~1 in 10^8, where glibc's is off by an
/// ulp for ~6e-4 of arguments).
void swiglu(float* gate, const float* up, int64_t n, cudaStream_t stream);

/// gate[i] = gelu_tanh(gate[i]) * up[i] (GeGLU, Gemma): gelu_tanh(g) =
/// 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), evaluated in double as
/// g / (1 + exp(-2 sqrt(2/pi) (g + 0.044715 g^3))) (the same function,
/// without the cancellation of 1 + tanh for negative g), rounded to fp32, then
/// times up in fp32.
void geglu_tanh(float* gate, const float* up, int64_t n, cudaStream_t stream);

/// x[i] += y[i] over n elements (the residual add). x and y may not overlap
/// unless equal.
void add(float* x, const float* y, int64_t n, cudaStream_t stream);

/// x[t][i] += bias[i] for T rows of n (Qwen2's Q/K/V bias).
void add_bias(float* x, const float* bias, int T, int n, cudaStream_t stream);

/// x[i] *= s over n elements (Gemma's sqrt(d_model) embedding scale).
void scale(float* x, float s, int64_t n, cudaStream_t stream);

/// out[i] = bf16(x[i]) over n elements: raw bf16 bits (activekv::bf16),
/// round to nearest even, NaN kept a quiet NaN with its sign and top payload
/// bits -- bit for bit activekv::f32_to_bf16 (core/bf16.h). For GEMM inputs.
void f32_to_bf16(const float* x, uint16_t* out, int64_t n, cudaStream_t stream);

}  // namespace activekv::cuda
