#include "activekv/model/config.h"

#include <fmt/format.h>

#include <limits>

namespace activekv::model {
namespace {

int positive_int(const std::string& key, uint64_t value) {
  if (value == 0 || value > uint64_t(std::numeric_limits<int>::max())) {
    throw Error(fmt::format("model config: {} = {} is out of range", key, value));
  }
  return int(value);
}

}  // namespace

ModelConfig ModelConfig::from_gguf(const gguf::File& f) {
  ModelConfig c;
  c.arch = f.get_string("general.architecture");
  if (c.arch != "llama") {
    throw Error(fmt::format("model config: architecture '{}' is not supported (supported: llama)", c.arch));
  }
  c.name = f.get_string_or("general.name", "");
  const std::string a = c.arch + ".";
  auto get = [&](const std::string& key) { return positive_int(key, f.get_u64(key)); };
  c.n_layers = get(a + "block_count");
  c.d_model = get(a + "embedding_length");
  c.n_heads = get(a + "attention.head_count");
  c.n_kv_heads = positive_int(a + "attention.head_count_kv",
                              f.get_u64_or(a + "attention.head_count_kv", uint64_t(c.n_heads)));
  c.ffn_dim = get(a + "feed_forward_length");
  c.context_length = get(a + "context_length");
  if (c.d_model % c.n_heads != 0) {
    throw Error(fmt::format("model config: embedding_length {} is not a multiple of head_count {}",
                            c.d_model, c.n_heads));
  }
  c.head_dim = positive_int(a + "attention.key_length",
                            f.get_u64_or(a + "attention.key_length", uint64_t(c.d_model / c.n_heads)));
  if (c.n_heads % c.n_kv_heads != 0) {
    throw Error(fmt::format("model config: head_count {} is not a multiple of head_count_kv {}",
                            c.n_heads, c.n_kv_heads));
  }
  c.rope_dim = positive_int(a + "rope.dimension_count",
                            f.get_u64_or(a + "rope.dimension_count", uint64_t(c.head_dim)));
  if (c.rope_dim > c.head_dim || c.rope_dim % 2 != 0) {
    throw Error(fmt::format("model config: rope.dimension_count {} must be even and <= head_dim {}",
                            c.rope_dim, c.head_dim));
  }
  c.rope_base = float(f.get_f64_or(a + "rope.freq_base", 10000.0));
  c.rms_eps = float(f.get_f64_or(a + "attention.layer_norm_rms_epsilon", 1e-5));
  c.rope_layout = RopeLayout::Interleaved;  // llama.cpp LLAMA_ROPE_TYPE_NORM for arch llama
  const gguf::TensorInfo& embd = f.tensor("token_embd.weight");
  if (embd.dims.size() != 2) throw Error("model config: token_embd.weight must be 2-D");
  c.vocab_size = positive_int("token_embd.weight dims[1]", embd.dims[1]);
  c.tied_output = f.find_tensor("output.weight") == nullptr;
  return c;
}

size_t ModelConfig::kv_bytes_per_token() const {
  return 2 * size_t(n_layers) * size_t(n_kv_heads) * size_t(head_dim) * 2;
}

}  // namespace activekv::model
