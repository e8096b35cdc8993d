#include "activekv/runtime/gpu_forward.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>

#include "activekv/cuda/model_ops.h"
#include "device_buffer.h"

namespace activekv::runtime {
namespace {

float* device_floats(size_t n, const char* what) { return cuda::device_alloc<float>(n, std::string("GpuForward: ") + what); }

}  // namespace

size_t GpuForward::row_bytes(const model::ModelConfig& c) {
  const size_t d = size_t(c.d_model), qd = size_t(c.n_heads) * c.head_dim, kvd = size_t(c.n_kv_heads) * c.head_dim,
               ff = size_t(c.ffn_dim);
  const size_t widest = std::max({d, qd, ff});
  return sizeof(float) * (2 * d + 2 * qd + 2 * kvd + 2 * ff + size_t(c.vocab_size)) + 2 * widest;
}

GpuForward::GpuForward(const model::ModelConfig& c, const GpuWeights& w, int max_rows, bool f32_activations)
    : c_(c), w_(w), max_rows_(max_rows), f32_activations_(f32_activations) {
  if (max_rows <= 0) throw InvalidArgument("GpuForward: max_rows must be positive");
  try {
    allocate();
  } catch (...) {
    release();  // the buffers had so far: a caller may retry with fewer rows
    throw;
  }
}

void GpuForward::allocate() {
  const model::ModelConfig& c = c_;
  const int max_rows = max_rows_;
  const size_t R = size_t(max_rows), d = size_t(c.d_model), qd = size_t(c.n_heads) * c.head_dim,
               kvd = size_t(c.n_kv_heads) * c.head_dim, ff = size_t(c.ffn_dim);
  x_ = device_floats(R * d, "the residual stream");
  xn_ = device_floats(R * d, "normalised rows");
  q_ = device_floats(R * qd, "queries");
  k_ = device_floats(R * kvd, "keys");
  v_ = device_floats(R * kvd, "values");
  att_ = device_floats(R * qd, "attention outputs");
  gate_ = device_floats(R * ff, "FFN gate");
  up_ = device_floats(R * ff, "FFN up");
  logits_ = device_floats(R * size_t(c.vocab_size), "logits");
  const int64_t widest = std::max<int64_t>({int64_t(d), int64_t(qd), int64_t(ff)});
  const size_t ws = cuda::matvec_workspace_bytes(widest, std::min(max_rows, kMatvecRows));
  matvec_ws_ = cuda::device_malloc(ws, "GpuForward: matvec workspace");
  cuda::WeightGemm::Options go;
  go.max_tokens = max_rows;
  go.max_cols = widest;
  gemm_ = std::make_unique<cuda::WeightGemm>(go);
  rope_ = std::make_unique<cuda::RopeFreqs>(c);
}

GpuForward::~GpuForward() { release(); }

void GpuForward::release() {
  for (float* p : {x_, xn_, q_, k_, v_, att_, gate_, up_, logits_}) cudaFree(p);
  cudaFree(matvec_ws_);
  x_ = xn_ = q_ = k_ = v_ = att_ = gate_ = up_ = logits_ = nullptr;
  matvec_ws_ = nullptr;
}

void GpuForward::project(const cuda::DeviceMatrix& w, const float* in, int T, float* out, bool accumulate,
                         cudaStream_t s) {
  if (f32_activations_) {  // the CPU path's arithmetic for every row count: prefill too, 8 rows per launch
    for (int r0 = 0; r0 < T; r0 += kMatvecRows)
      cuda::launch_matvec_f32_activations(w, in + size_t(r0) * size_t(w.cols), std::min(kMatvecRows, T - r0),
                                          out + size_t(r0) * size_t(w.rows), accumulate, s);
  } else if (T <= kMatvecRows) {
    cuda::launch_matvec(w, in, T, out, accumulate, matvec_ws_, s);
  } else {
    gemm_->run(w, in, T, out, accumulate, s);
  }
}

// RMSNorm of `in` into xn_, then several projections of xn_. For a matvec the
// norm's kernel also quantises its output to int8 (launch_rms_norm_quantize),
// once for all of them: no launch of its own.
void GpuForward::norm_project(const float* in, const float* norm_w, int T,
                              std::initializer_list<std::pair<const cuda::DeviceMatrix*, float*>> outs,
                              cudaStream_t s) {
  const int d = c_.d_model;
  if (T > kMatvecRows || f32_activations_ || d % 32 != 0) {
    cuda::rms_norm(in, norm_w, T, d, c_.rms_eps, xn_, s);
    for (const auto& [w, out] : outs) project(*w, xn_, T, out, false, s);
    return;
  }
  cuda::launch_rms_norm_quantize(in, norm_w, T, d, c_.rms_eps, xn_, matvec_ws_, s);
  for (const auto& [w, out] : outs) cuda::launch_matvec_prequantized(*w, xn_, T, out, false, matvec_ws_, s);
}

void GpuForward::layer(int l, int T, const int64_t* pos, const LayerAttention& attend, cudaStream_t s) {
  const GpuLayerWeights& L = w_.layers[size_t(l)];
  const int qd = c_.n_heads * c_.head_dim, kvd = c_.n_kv_heads * c_.head_dim;
  norm_project(x_, L.attn_norm, T, {{&L.wq, q_}, {&L.wk, k_}, {&L.wv, v_}}, s);
  if (L.bq) {
    cuda::add_bias(q_, L.bq, T, qd, s);
    cuda::add_bias(k_, L.bk, T, kvd, s);
    cuda::add_bias(v_, L.bv, T, kvd, s);
  }
  cuda::rope_qk(q_, c_.n_heads, k_, c_.n_kv_heads, T, c_.head_dim, pos, *rope_, s);
  attend(l, T, q_, k_, v_, att_);
  project(L.wo, att_, T, x_, true, s);
  norm_project(x_, L.ffn_norm, T, {{&L.w_gate, gate_}, {&L.w_up, up_}}, s);
  if (T <= kMatvecRows && !f32_activations_ && c_.ffn_dim % 32 == 0) {  // the down matvec's int8 input, fused
    cuda::launch_swiglu_quantize(gate_, up_, T, c_.ffn_dim, matvec_ws_, s);
    cuda::launch_matvec_prequantized(L.w_down, gate_, T, x_, true, matvec_ws_, s);
  } else {
    cuda::swiglu(gate_, up_, int64_t(T) * c_.ffn_dim, s);
    project(L.w_down, gate_, T, x_, true, s);
  }
}

void GpuForward::run(const int32_t* ids, const int64_t* pos, int T, const LayerAttention& attend, bool all_logits,
                     cudaStream_t s) {
  if (T <= 0 || T > max_rows_)
    throw InvalidArgument(fmt::format("GpuForward::run: {} rows, the buffers hold 1..{}", T, max_rows_));
  const int d = c_.d_model;
  cuda::launch_gather_rows_f32(w_.token_embd, ids, T, x_, s);
  for (int l = 0; l < c_.n_layers; ++l) layer(l, T, pos, attend, s);
  const int first = all_logits ? 0 : T - 1;
  const int rows = T - first;
  norm_project(x_ + size_t(first) * d, w_.output_norm, rows, {{&w_.output, logits_}}, s);
}

}  // namespace activekv::runtime
