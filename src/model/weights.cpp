#include "activekv/model/weights.h"

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

}  // namespace

Weights Weights::load(const gguf::File& f, const ModelConfig& c) {
  const ModelTensors m = ModelTensors::find(f, c);
  Weights w;
  w.token_embd = dequantized(m.token_embd);
  w.output_norm = dequantized(m.output_norm);
  if (!c.tied_output) w.output = dequantized(m.output);
  w.layers.resize(m.layers.size());
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const LayerTensors& t = m.layers[l];
    LayerWeights& L = w.layers[l];
    L.attn_norm = dequantized(t.attn_norm);
    L.wq = dequantized(t.wq);
    L.wk = dequantized(t.wk);
    L.wv = dequantized(t.wv);
    L.bq = dequantized(t.bq);
    L.bk = dequantized(t.bk);
    L.bv = dequantized(t.bv);
    L.wo = dequantized(t.wo);
    L.ffn_norm = dequantized(t.ffn_norm);
    L.w_gate = dequantized(t.w_gate);
    L.w_up = dequantized(t.w_up);
    L.w_down = dequantized(t.w_down);
    L.q_norm = dequantized(t.q_norm);
    L.k_norm = dequantized(t.k_norm);
    L.post_attn_norm = dequantized(t.post_attn_norm);
    L.post_ffn_norm = dequantized(t.post_ffn_norm);
  }
  return w;
}

}  // namespace activekv::model
