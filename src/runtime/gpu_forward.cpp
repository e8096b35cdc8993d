#include "activekv/runtime/gpu_forward.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>

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

GpuForward::GpuForward(const model::ModelConfig& c, const GpuWeights& w, int max_rows, bool f32_activations,
                       model::StageObserver observer)
    : c_(c), w_(w), max_rows_(max_rows), f32_activations_(f32_activations), observer_(std::move(observer)) {
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
  // One frequency table per distinct base (gemma3: local 10000, global from the GGUF).
  std::vector<float> bases;
  for (int l = 0; l < c.n_layers; ++l) {
    const float base = size_t(l) < c.layer_attention.size() ? c.layer_attention[size_t(l)].rope_base : c.rope_base;
    const size_t i = size_t(std::find(bases.begin(), bases.end(), base) - bases.begin());
    if (i == bases.size()) {
      bases.push_back(base);
      ropes_.push_back(std::make_unique<cuda::RopeFreqs>(c.rope_dim, base, c.rope_layout));
    }
    layer_rope_.push_back(ropes_[i].get());
  }
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
// once for all of them: no launch of its own; and matrices of one type and
// cols (Q, K, V; gate and up) run as one grouped launch. Measured on the H200
// (27B shape, Q4_0, bench_matvec --groups, h200_ab_step_latency_7511be3.json),
// one vector, us grouped / separate: Q+K+V 10.59 / 17.76, gate+up 28.95 /
// 30.93 (8 vectors: 22.55 / 34.33 and 78.68 / 79.81). Before 9c3ea14 the
// grouped kernels copied their arguments to local memory and gate+up lost
// grouped (42.16 against 30.56), so only groups with a small matrix were
// grouped. Every output row is bitwise the separate launch's
// (quant_matvec.h), whatever T: the batch == solo contract (gpu_model.h)
// holds as before.
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
  std::array<cuda::MatvecGroupItem, cuda::kMaxMatvecGroup> group{};
  const cuda::DeviceMatrix* w0 = outs.begin()->first;
  bool groupable = outs.size() <= group.size() && outs.size() > 1;
  for (const auto& [w, out] : outs) groupable = groupable && w->type == w0->type && w->cols == w0->cols;
  if (!groupable) {  // one matrix, or mixed types or cols (a model quantised per tensor): one launch each
    for (const auto& [w, out] : outs) cuda::launch_matvec_prequantized(*w, xn_, T, out, false, matvec_ws_, s);
    return;
  }
  int n = 0;
  for (const auto& [w, out] : outs) group[size_t(n++)] = {w, out};
  cuda::launch_matvec_prequantized_group(group.data(), n, xn_, T, matvec_ws_, s);
}

// x += W in; with a post-norm (gemma3) x += RMSNorm(W in) * post_norm, the
// product going through xn_ (free at both places this is called).
// in_quantized: in's int8 blocks are in the matvec workspace already.
// to_x false (tensor parallel): xn_ = W in only, the shard's partial sum,
// which add_partial adds once the coordinator has all-reduced it.
void GpuForward::residual_add(const cuda::DeviceMatrix& w, const float* in, const float* post_norm, int T,
                              cudaStream_t s, bool in_quantized, bool to_x) {
  float* out = post_norm || !to_x ? xn_ : x_;
  const bool accumulate = to_x && !post_norm;
  if (in_quantized) {
    cuda::launch_matvec_prequantized(w, in, T, out, accumulate, matvec_ws_, s);
  } else {
    project(w, in, T, out, accumulate, s);
  }
  if (to_x && post_norm) add_xn(post_norm, T, s);
}

// x += xn_, through the post-norm when there is one.
void GpuForward::add_xn(const float* post_norm, int T, cudaStream_t s) {
  if (post_norm) cuda::rms_norm(xn_, post_norm, T, c_.d_model, c_.rms_eps, xn_, s);
  cuda::add(x_, xn_, int64_t(T) * c_.d_model, s);
}

void GpuForward::observe(int layer, model::Stage stage, const float* rows, int T, int width, cudaStream_t s) {
  if (!observer_) return;
  observed_.resize(size_t(T) * size_t(width));
  cuda::check_cuda(cudaStreamSynchronize(s), "GpuForward: observer");
  cuda::check_cuda(cudaMemcpy(observed_.data(), rows, observed_.size() * sizeof(float), cudaMemcpyDeviceToHost),
                   "GpuForward: observer copy");
  observer_(layer, stage, T, width, observed_.data());
}

// Layer l's attention half: norm, Q/K/V, RoPE, attention, output projection
// (into x, or with to_x false into xn_: residual_add).
void GpuForward::attention_half(int l, int T, const int64_t* pos, const LayerAttention& attend, cudaStream_t s,
                                bool to_x) {
  const GpuLayerWeights& L = w_.layers[size_t(l)];
  const int qd = c_.n_heads * c_.head_dim, kvd = c_.n_kv_heads * c_.head_dim;
  norm_project(x_, L.attn_norm, T, {{&L.wq, q_}, {&L.wk, k_}, {&L.wv, v_}}, s);
  if (L.bq) {
    cuda::add_bias(q_, L.bq, T, qd, s);
    cuda::add_bias(k_, L.bk, T, kvd, s);
    cuda::add_bias(v_, L.bv, T, kvd, s);
  }
  if (L.q_norm) {  // QK-norm: RMSNorm over each head's head_dim channels
    cuda::rms_norm(q_, L.q_norm, T * c_.n_heads, c_.head_dim, c_.rms_eps, q_, s);
    cuda::rms_norm(k_, L.k_norm, T * c_.n_kv_heads, c_.head_dim, c_.rms_eps, k_, s);
  }
  cuda::rope_qk(q_, c_.n_heads, k_, c_.n_kv_heads, T, c_.head_dim, pos, *layer_rope_[size_t(l)], s);
  observe(l, model::Stage::queries, q_, T, qd, s);
  // A matvec's input as int8 blocks: the attention's merge may write them.
  const bool int8_in = T <= kMatvecRows && !f32_activations_ && qd % 32 == 0;
  const bool quantized =
      attend(l, T, q_, k_, v_, att_, int8_in ? cuda::matvec_int8_blocks(matvec_ws_, qd, T) : cuda::Int8Blocks{});
  observe(l, model::Stage::attention, att_, T, qd, s);
  residual_add(L.wo, att_, L.post_attn_norm, T, s, quantized, to_x);
}

// Layer l's FFN half: norm, gate and up, the activation, down (into x, or into xn_).
void GpuForward::ffn_half(int l, int T, cudaStream_t s, bool to_x) {
  const GpuLayerWeights& L = w_.layers[size_t(l)];
  norm_project(x_, L.ffn_norm, T, {{&L.w_gate, gate_}, {&L.w_up, up_}}, s);
  if (c_.ffn_act == model::FfnActivation::GeluTanh) {
    cuda::geglu_tanh(gate_, up_, int64_t(T) * c_.ffn_dim, s);
    residual_add(L.w_down, gate_, L.post_ffn_norm, T, s, false, to_x);
  } else if (T <= kMatvecRows && !f32_activations_ && c_.ffn_dim % 32 == 0 && !L.post_ffn_norm) {
    // the down matvec's int8 input written by the SwiGLU kernel itself
    cuda::launch_swiglu_quantize(gate_, up_, T, c_.ffn_dim, matvec_ws_, s);
    cuda::launch_matvec_prequantized(L.w_down, gate_, T, to_x ? x_ : xn_, to_x, matvec_ws_, s);
  } else {
    cuda::swiglu(gate_, up_, int64_t(T) * c_.ffn_dim, s);
    residual_add(L.w_down, gate_, L.post_ffn_norm, T, s, false, to_x);
  }
}

void GpuForward::layer(int l, int T, const int64_t* pos, const LayerAttention& attend, cudaStream_t s) {
  attention_half(l, T, pos, attend, s, true);
  ffn_half(l, T, s, true);
  observe(l, model::Stage::layer_output, x_, T, c_.d_model, s);
}

void GpuForward::check_run(int T, bool all_logits, int logits_row) const {
  if (T <= 0 || T > max_rows_)
    throw InvalidArgument(fmt::format("GpuForward::run: {} rows, the buffers hold 1..{}", T, max_rows_));
  if (logits_row < 0 || logits_row + (all_logits ? T : 1) > max_rows_)
    throw InvalidArgument(fmt::format("GpuForward::run: logits row {} for {} rows, the buffer holds {}", logits_row,
                                      all_logits ? T : 1, max_rows_));
}

void GpuForward::embed(const int32_t* ids, int T, cudaStream_t s) {
  cuda::launch_gather_rows_f32(w_.token_embd, ids, T, x_, s);
  if (c_.embed_scale != 1.0f) cuda::scale(x_, c_.embed_scale, int64_t(T) * c_.d_model, s);
  observe(-1, model::Stage::embedding, x_, T, c_.d_model, s);
}

void GpuForward::head(int T, bool all_logits, cudaStream_t s, int logits_row) {
  const int first = all_logits ? 0 : T - 1;
  norm_project(x_ + size_t(first) * size_t(c_.d_model), w_.output_norm, T - first,
               {{&w_.output, logits_ + size_t(logits_row) * size_t(c_.vocab_size)}}, s);
}

void GpuForward::attention_partial(int l, int T, const int64_t* pos, const LayerAttention& attend, cudaStream_t s) {
  attention_half(l, T, pos, attend, s, false);
}

void GpuForward::ffn_partial(int l, int T, cudaStream_t s) { ffn_half(l, T, s, false); }

void GpuForward::add_partial(int l, bool after_ffn, int T, cudaStream_t s) {
  const GpuLayerWeights& L = w_.layers[size_t(l)];
  add_xn(after_ffn ? L.post_ffn_norm : L.post_attn_norm, T, s);
}

void GpuForward::run(const int32_t* ids, const int64_t* pos, int T, const LayerAttention& attend, bool all_logits,
                     cudaStream_t s, int logits_row) {
  check_run(T, all_logits, logits_row);
  embed(ids, T, s);
  for (int l = 0; l < c_.n_layers; ++l) layer(l, T, pos, attend, s);
  head(T, all_logits, s, logits_row);
}

}  // namespace activekv::runtime
