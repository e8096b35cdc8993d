// Internal to the CUDA backend: the kernel launchers behind
// activekv/cuda/model_ops.h. Arguments are validated by the callers
// (model_ops.cpp); these only pick the vector width, launch on `stream` and
// throw CudaError if the launch fails. Plain C++17 so nvcc compiles it.
#pragma once

#include <cstdint>

typedef struct CUstream_st* cudaStream_t;

namespace activekv::cuda::kernels {

void rms_norm(const float* x, const float* weight, int T, int n, float eps, float* out, cudaStream_t stream);
/// rms_norm that also writes out's int8 blocks into the matvec workspace (the
/// layout of launch_quantize_activations for cols n, T vectors). Returns
/// false, launching nothing, unless n % 32 == 0 and x, weight, out are
/// 16-byte aligned.
bool rms_norm_quantize(const float* x, const float* weight, int T, int n, float eps, float* out, void* workspace,
                       cudaStream_t stream);
/// freqs: rope_dim/2 doubles on the device; half_split: NeoX pairing. x2
/// (n_heads2 heads, may be null) is rotated in the same launch.
void rope(float* x, int n_heads, float* x2, int n_heads2, int T, int head_dim, const int64_t* pos,
          const double* freqs, int rope_dim, bool half_split, cudaStream_t stream);
void swiglu(float* gate, const float* up, int64_t n, cudaStream_t stream);
/// swiglu over T rows of n that also writes gate's int8 blocks into the matvec
/// workspace (cols n, T vectors). Returns false, launching nothing, unless
/// n % 32 == 0 and gate, up are 16-byte aligned.
bool swiglu_quantize(float* gate, const float* up, int T, int n, void* workspace, cudaStream_t stream);
void geglu_tanh(float* gate, const float* up, int64_t n, cudaStream_t stream);
void add(float* x, const float* y, int64_t n, cudaStream_t stream);
void add_bias(float* x, const float* bias, int T, int n, cudaStream_t stream);
void scale(float* x, float s, int64_t n, cudaStream_t stream);
void f32_to_bf16(const float* x, uint16_t* out, int64_t n, cudaStream_t stream);

}  // namespace activekv::cuda::kernels
