#include "activekv/model/tensors.h"

#include <fmt/format.h>

namespace activekv::model {
namespace {

const gguf::TensorInfo* checked(const gguf::File& f, const std::string& name, const std::vector<uint64_t>& want) {
  const gguf::TensorInfo& t = f.tensor(name);  // throws naming a missing tensor
  if (t.dims != want) {
    throw Error(fmt::format("model: tensor '{}' has dims [{}], expected [{}]", name, fmt::join(t.dims, ", "),
                            fmt::join(want, ", ")));
  }
  return &t;
}

}  // namespace

ModelTensors ModelTensors::find(const gguf::File& f, const ModelConfig& c) {
  using u = uint64_t;
  const u d = u(c.d_model), q_out = u(c.n_heads) * u(c.head_dim), kv_out = u(c.n_kv_heads) * u(c.head_dim),
          ff = u(c.ffn_dim), vocab = u(c.vocab_size);
  ModelTensors m;
  m.token_embd = checked(f, "token_embd.weight", {d, vocab});
  m.output_norm = checked(f, "output_norm.weight", {d});
  m.output = c.tied_output ? m.token_embd : checked(f, "output.weight", {d, vocab});
  m.layers.resize(size_t(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = fmt::format("blk.{}.", l);
    LayerTensors& L = m.layers[size_t(l)];
    L.attn_norm = checked(f, p + "attn_norm.weight", {d});
    L.wq = checked(f, p + "attn_q.weight", {d, q_out});
    L.wk = checked(f, p + "attn_k.weight", {d, kv_out});
    L.wv = checked(f, p + "attn_v.weight", {d, kv_out});
    if (c.qkv_bias) {
      L.bq = checked(f, p + "attn_q.bias", {q_out});
      L.bk = checked(f, p + "attn_k.bias", {kv_out});
      L.bv = checked(f, p + "attn_v.bias", {kv_out});
    }
    L.wo = checked(f, p + "attn_output.weight", {q_out, d});
    L.ffn_norm = checked(f, p + "ffn_norm.weight", {d});
    L.w_gate = checked(f, p + "ffn_gate.weight", {d, ff});
    L.w_up = checked(f, p + "ffn_up.weight", {d, ff});
    L.w_down = checked(f, p + "ffn_down.weight", {ff, d});
    if (c.qk_norm) {
      L.q_norm = checked(f, p + "attn_q_norm.weight", {u(c.head_dim)});
      L.k_norm = checked(f, p + "attn_k_norm.weight", {u(c.head_dim)});
    }
    if (c.post_norms) {
      L.post_attn_norm = checked(f, p + "post_attention_norm.weight", {d});
      L.post_ffn_norm = checked(f, p + "post_ffw_norm.weight", {d});
    }
  }
  return m;
}

}  // namespace activekv::model
