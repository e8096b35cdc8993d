// Argument checks and the RoPE frequency table of activekv/cuda/model_ops.h;
// the kernels are in model_ops.cu.
#include "activekv/cuda/model_ops.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cmath>
#include <string_view>
#include <vector>

#include "activekv/cuda/decode_attention.h"
#include "device_buffer.h"
#include "model_ops_kernels.h"

namespace activekv::cuda {
namespace {

void need(bool ok, std::string_view op, std::string_view problem) {
  if (!ok) throw InvalidArgument(fmt::format("cuda::{}: {}", op, problem));
}

void need_size(int64_t v, std::string_view op, std::string_view name) {
  need(v >= 0, op, fmt::format("{} must be >= 0, got {}", name, v));
}

// Pointers are only needed when there is work: a null with work is a bug.
void need_ptr(const void* p, int64_t work, std::string_view op, std::string_view name) {
  need(p != nullptr || work == 0, op, fmt::format("{} is null", name));
}

void check_elementwise(const float* a, const float* b, int64_t n, std::string_view op) {
  need_size(n, op, "n");
  need_ptr(a, n, op, "the output");
  need_ptr(b, n, op, "the second input");
}

}  // namespace

void rms_norm(const float* x, const float* weight, int T, int n, float eps, float* out, cudaStream_t stream) {
  need_size(T, "rms_norm", "T");
  need_size(n, "rms_norm", "n");
  const int64_t work = int64_t(T) * n;
  need_ptr(x, work, "rms_norm", "x");
  need_ptr(weight, work, "rms_norm", "weight");
  need_ptr(out, work, "rms_norm", "out");
  need(std::isfinite(eps) && eps >= 0.0f, "rms_norm", fmt::format("eps must be finite and >= 0, got {}", eps));
  kernels::rms_norm(x, weight, T, n, eps, out, stream);
}

RopeFreqs::RopeFreqs(int rope_dim, float base, model::RopeLayout layout) : rope_dim_(rope_dim), layout_(layout) {
  need(rope_dim > 0 && rope_dim % 2 == 0, "RopeFreqs", fmt::format("rope_dim must be positive and even, got {}", rope_dim));
  need(std::isfinite(base) && base > 0.0f, "RopeFreqs", fmt::format("base must be finite and > 0, got {}", base));
  const int half = rope_dim / 2;
  std::vector<double> f(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) f[size_t(i)] = std::pow(double(base), -2.0 * i / double(rope_dim));  // as ops.cpp
  freqs_ = std::make_unique<DevBuf>(f.size() * sizeof(double));
  check_cuda(cudaMemcpy(freqs_->p, f.data(), f.size() * sizeof(double), cudaMemcpyHostToDevice),
             "RopeFreqs: cudaMemcpy of the frequencies");
}

RopeFreqs::~RopeFreqs() = default;
RopeFreqs::RopeFreqs(RopeFreqs&&) noexcept = default;
RopeFreqs& RopeFreqs::operator=(RopeFreqs&&) noexcept = default;

const double* RopeFreqs::freqs() const { return freqs_ ? freqs_->as<double>() : nullptr; }

namespace {

void check_rope(float* x, int T, int n_heads, int head_dim, const int64_t* pos, const RopeFreqs& freqs,
                std::string_view what) {
  need_size(T, "rope", "T");
  need_size(n_heads, "rope", "n_heads");
  need(freqs.freqs() != nullptr, "rope", "the RopeFreqs was moved from");
  need(freqs.rope_dim() <= head_dim, "rope",
       fmt::format("rope_dim {} exceeds head_dim {}", freqs.rope_dim(), head_dim));
  const int64_t work = int64_t(T) * n_heads;
  need_ptr(x, work, "rope", what);
  need_ptr(pos, work, "rope", "pos");
}

}  // namespace

void rope(float* x, int T, int n_heads, int head_dim, const int64_t* pos, const RopeFreqs& freqs,
          cudaStream_t stream) {
  check_rope(x, T, n_heads, head_dim, pos, freqs, "x");
  kernels::rope(x, n_heads, nullptr, 0, T, head_dim, pos, freqs.freqs(), freqs.rope_dim(),
                freqs.layout() == model::RopeLayout::HalfSplit, stream);
}

void rope_qk(float* q, int n_heads, float* k, int n_kv_heads, int T, int head_dim, const int64_t* pos,
             const RopeFreqs& freqs, cudaStream_t stream) {
  check_rope(q, T, n_heads, head_dim, pos, freqs, "q");
  check_rope(k, T, n_kv_heads, head_dim, pos, freqs, "k");
  kernels::rope(q, n_heads, k, n_kv_heads, T, head_dim, pos, freqs.freqs(), freqs.rope_dim(),
                freqs.layout() == model::RopeLayout::HalfSplit, stream);
}

void swiglu(float* gate, const float* up, int64_t n, cudaStream_t stream) {
  check_elementwise(gate, up, n, "swiglu");
  kernels::swiglu(gate, up, n, stream);
}

void geglu_tanh(float* gate, const float* up, int64_t n, cudaStream_t stream) {
  check_elementwise(gate, up, n, "geglu_tanh");
  kernels::geglu_tanh(gate, up, n, stream);
}

void add(float* x, const float* y, int64_t n, cudaStream_t stream) {
  check_elementwise(x, y, n, "add");
  kernels::add(x, y, n, stream);
}

void add_bias(float* x, const float* bias, int T, int n, cudaStream_t stream) {
  need_size(T, "add_bias", "T");
  need_size(n, "add_bias", "n");
  check_elementwise(x, bias, int64_t(T) * n, "add_bias");
  kernels::add_bias(x, bias, T, n, stream);
}

void scale(float* x, float s, int64_t n, cudaStream_t stream) {
  check_elementwise(x, x, n, "scale");
  kernels::scale(x, s, n, stream);
}

void f32_to_bf16(const float* x, uint16_t* out, int64_t n, cudaStream_t stream) {
  need_size(n, "f32_to_bf16", "n");
  need_ptr(x, n, "f32_to_bf16", "x");
  need_ptr(out, n, "f32_to_bf16", "out");
  kernels::f32_to_bf16(x, out, n, stream);
}

}  // namespace activekv::cuda
