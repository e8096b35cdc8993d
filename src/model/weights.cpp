#include "activekv/model/weights.h"

#include <cstdlib>
#include <cstring>

#include "activekv/core/blas.h"
#include "activekv/core/error.h"
#include "activekv/gguf/tensor_type.h"
#include "activekv/model/tensors.h"

namespace activekv::model {
namespace {

std::vector<float> dequantized(const gguf::TensorInfo* t) {
  if (!t) return {};
  std::vector<float> out(t->n_elements);
  gguf::dequantize(t->type, t->data, out.data(), t->n_elements);
  return out;
}

bool held_as_blocks(const gguf::TensorInfo& t, WeightFormat format) {
  return format == WeightFormat::automatic && t.dims.size() == 2 && quant_matmul_supports(t.type);
}

// GGUF dims are [in, out]: dims[0] is the row length (model/tensors.h checked them).
Matrix matrix(const gguf::TensorInfo* t, WeightFormat format) {
  Matrix m;
  if (!t) return m;
  m.cols = int64_t(t->dims.at(0));
  m.rows = int64_t(t->n_elements / t->dims.at(0));
  if (held_as_blocks(*t, format)) {
    m.quant.type = t->type;
    m.quant.rows = m.rows;
    m.quant.cols = m.cols;
    m.quant.blocks.assign(t->data, t->data + t->n_bytes);
  } else {
    m.f32 = dequantized(t);
  }
  return m;
}

}  // namespace

void Matrix::project(int n, const float* x, float* y, QuantScratch& scratch) const {
  if (quantized()) return quant_matmul(quant, n, x, y, scratch);
  gemm_nt(n, int(rows), int(cols), 1.0f, x, int(cols), f32.data(), int(cols), 0.0f, y, int(rows));
}

void Matrix::row(int64_t r, float* out) const {
  if (quantized()) return quant.dequantize_row(r, out);
  std::memcpy(out, f32.data() + size_t(r) * size_t(cols), size_t(cols) * sizeof(float));
}

uint64_t cpu_tensor_bytes(const gguf::TensorInfo& t, WeightFormat format) {
  return held_as_blocks(t, format) ? t.n_bytes : t.n_elements * sizeof(float);
}

WeightFormat weight_format_from_env() {
  const char* v = std::getenv("ACTIVEKV_CPU_WEIGHTS");
  const std::string s = v ? v : "";
  if (s.empty() || s == "auto") return WeightFormat::automatic;
  if (s == "f32") return WeightFormat::f32;
  throw InvalidArgument("ACTIVEKV_CPU_WEIGHTS=" + s + ": expected auto or f32");
}

Weights Weights::load(const gguf::File& f, const ModelConfig& c, WeightFormat format) {
  const ModelTensors m = ModelTensors::find(f, c);
  Weights w;
  w.token_embd = matrix(m.token_embd, format);
  w.output_norm = dequantized(m.output_norm);
  if (!c.tied_output) w.output = matrix(m.output, format);
  w.layers.resize(m.layers.size());
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const LayerTensors& t = m.layers[l];
    LayerWeights& L = w.layers[l];
    L.attn_norm = dequantized(t.attn_norm);
    L.wq = matrix(t.wq, format);
    L.wk = matrix(t.wk, format);
    L.wv = matrix(t.wv, format);
    L.bq = dequantized(t.bq);
    L.bk = dequantized(t.bk);
    L.bv = dequantized(t.bv);
    L.wo = matrix(t.wo, format);
    L.ffn_norm = dequantized(t.ffn_norm);
    L.w_gate = matrix(t.w_gate, format);
    L.w_up = matrix(t.w_up, format);
    L.w_down = matrix(t.w_down, format);
    L.q_norm = dequantized(t.q_norm);
    L.k_norm = dequantized(t.k_norm);
    L.post_attn_norm = dequantized(t.post_attn_norm);
    L.post_ffn_norm = dequantized(t.post_ffn_norm);
  }
  return w;
}

}  // namespace activekv::model
