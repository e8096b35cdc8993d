#include "activekv/model/weights.h"

#include <fmt/format.h>

#include "activekv/gguf/tensor_type.h"

namespace activekv::model {
namespace {

std::string dims_str(const std::vector<uint64_t>& d) {
  return fmt::format("[{}]", fmt::join(d, ", "));
}

// Dequantises tensor `name`, checking its dims are exactly `want` (GGUF order).
std::vector<float> load_tensor(const gguf::File& f, const std::string& name,
                               std::vector<uint64_t> want) {
  const gguf::TensorInfo& t = f.tensor(name);
  if (t.dims != want) {
    throw Error(fmt::format("model: tensor '{}' has dims {}, expected {}", name, dims_str(t.dims),
                            dims_str(want)));
  }
  std::vector<float> out(t.n_elements);
  gguf::dequantize(t.type, t.data, out.data(), t.n_elements);
  return out;
}

}  // namespace

Weights Weights::load(const gguf::File& f, const ModelConfig& c) {
  using u = uint64_t;
  const u d = u(c.d_model), q_out = u(c.n_heads) * u(c.head_dim),
          kv_out = u(c.n_kv_heads) * u(c.head_dim), ff = u(c.ffn_dim), vocab = u(c.vocab_size);
  Weights w;
  w.token_embd = load_tensor(f, "token_embd.weight", {d, vocab});
  w.output_norm = load_tensor(f, "output_norm.weight", {d});
  if (!c.tied_output) w.output = load_tensor(f, "output.weight", {d, vocab});
  w.layers.resize(size_t(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = fmt::format("blk.{}.", l);
    LayerWeights& L = w.layers[size_t(l)];
    L.attn_norm = load_tensor(f, p + "attn_norm.weight", {d});
    L.wq = load_tensor(f, p + "attn_q.weight", {d, q_out});
    L.wk = load_tensor(f, p + "attn_k.weight", {d, kv_out});
    L.wv = load_tensor(f, p + "attn_v.weight", {d, kv_out});
    L.wo = load_tensor(f, p + "attn_output.weight", {q_out, d});
    L.ffn_norm = load_tensor(f, p + "ffn_norm.weight", {d});
    L.w_gate = load_tensor(f, p + "ffn_gate.weight", {d, ff});
    L.w_up = load_tensor(f, p + "ffn_up.weight", {d, ff});
    L.w_down = load_tensor(f, p + "ffn_down.weight", {ff, d});
  }
  return w;
}

}  // namespace activekv::model
