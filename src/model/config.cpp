// ModelConfig::from_gguf: reads a model's hyper-parameters and rejects any
// the engine cannot run, each with one line naming the key and its value. A
// NaN epsilon or a zero RoPE base used to run and print garbage with exit 0.
#include "activekv/model/config.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <optional>

namespace activekv::model {
namespace {

/// What differs between the architectures we run; their keys are read under
/// "<name>." (gguf.md "LLM" keys). Supporting another one starts here.
struct Architecture {
  std::string_view name;
  RopeLayout rope_layout;
  bool qkv_bias;  ///< Q/K/V projections carry biases
  bool gemma = false;  ///< QK-norm, post-norms, GeGLU, scaled embeddings, sliding-window layers
};
constexpr Architecture kArchitectures[] = {
    {"llama", RopeLayout::Interleaved, false},  // llama.cpp LLAMA_ROPE_TYPE_NORM
    {"qwen2", RopeLayout::HalfSplit, true},     // llama.cpp LLAMA_ROPE_TYPE_NEOX; attn_{q,k,v}.bias
    {"gemma3", RopeLayout::HalfSplit, false, true},  // LLAMA_ROPE_TYPE_NEOX; Q/K stored unpermuted
};

// Gemma 3: every 6th layer (l % 6 == 5) is global, the others slide; local
// layers use RoPE base 10000 (llama.cpp hard-codes both for gemma3; HF's
// Gemma3TextConfig defaults: sliding_window_pattern 6, rope_local_base_freq 10000).
constexpr int kGemma3SlidingPattern = 6;
constexpr double kGemma3LocalRopeBase = 10000.0;

const Architecture& find_architecture(const std::string& name) {
  std::string supported;
  for (const Architecture& a : kArchitectures) {
    if (a.name == name) return a;
    supported += (supported.empty() ? "" : ", ") + std::string(a.name);
  }
  throw Error(fmt::format("model config: general.architecture = {:?} is not supported (supported: {})",
                          name, supported));
}

constexpr int64_t kMaxInt = std::numeric_limits<int>::max();

[[noreturn]] void bad(std::string_view key, std::string_view value, std::string_view why) {
  throw Error(fmt::format("model config: {} = {} {}", key, value, why));
}

/// The "<arch>." metadata of one file, read with the checks every key needs.
class ArchKeys {
 public:
  ArchKeys(const gguf::File& f, std::string_view arch) : f_(f), prefix_(std::string(arch) + ".") {}

  std::string key(std::string_view name) const { return prefix_ + std::string(name); }
  bool has(std::string_view name) const { return f_.find(key(name)) != nullptr; }

  /// A required count: an integer in [1, INT_MAX].
  int count(std::string_view name) const {
    const std::string k = key(name);
    const gguf::Value* v = f_.find(k);
    if (v == nullptr) throw Error(fmt::format("model config: {} is missing (required)", k));
    return positive_int(k, *v);
  }
  int count_or(std::string_view name, int fallback) const {
    return has(name) ? count(name) : fallback;
  }

  /// A finite number greater than `min` (after narrowing to float, so 1e-60
  /// cannot pass as a positive epsilon and then be 0).
  float real_above(std::string_view name, double min, std::optional<double> fallback) const {
    const std::string k = key(name);
    const gguf::Value* v = f_.find(k);
    if (v == nullptr) {
      if (!fallback) throw Error(fmt::format("model config: {} is missing (required)", k));
      return float(*fallback);
    }
    if (!v->is_integer() && !std::holds_alternative<double>(v->data)) {
      bad(k, v->to_string(), fmt::format("is {}, not a number", gguf::value_type_name(v->type)));
    }
    const float x = float(v->as_f64());
    if (!std::isfinite(x) || !(x > min)) {
      bad(k, v->to_string(), fmt::format("must be a finite number > {} (as float32)", min));
    }
    return x;
  }

  static int positive_int(const std::string& k, const gguf::Value& v) {
    if (!v.is_integer()) {
      bad(k, v.to_string(), fmt::format("is {}, not an integer", gguf::value_type_name(v.type)));
    }
    const bool in_range = std::holds_alternative<uint64_t>(v.data)
                              ? std::get<uint64_t>(v.data) - 1 < uint64_t(kMaxInt)
                              : std::get<int64_t>(v.data) >= 1 && std::get<int64_t>(v.data) <= kMaxInt;
    if (!in_range) bad(k, v.to_string(), fmt::format("must be in [1, {}]", kMaxInt));
    return int(v.as_i64());
  }

 private:
  const gguf::File& f_;
  std::string prefix_;
};

/// Head geometry: GQA grouping, head_dim (attention.key_length or
/// embedding_length / head_count), V head dim equal to K's, RoPE dims.
void read_heads(const ArchKeys& k, ModelConfig& c) {
  c.n_heads = k.count("attention.head_count");
  c.n_kv_heads = k.count_or("attention.head_count_kv", c.n_heads);
  if (c.n_heads % c.n_kv_heads != 0) {
    throw Error(fmt::format("model config: {} = {} is not a multiple of {} = {}",
                            k.key("attention.head_count"), c.n_heads,
                            k.key("attention.head_count_kv"), c.n_kv_heads));
  }
  std::string head_dim_key = k.key("attention.key_length");
  if (k.has("attention.key_length")) {
    c.head_dim = k.count("attention.key_length");
  } else {
    if (c.d_model % c.n_heads != 0) {
      throw Error(fmt::format("model config: {} = {} is not a multiple of {} = {} (and {} is absent)",
                              k.key("embedding_length"), c.d_model, k.key("attention.head_count"),
                              c.n_heads, head_dim_key));
    }
    c.head_dim = c.d_model / c.n_heads;
    head_dim_key = k.key("embedding_length") + " / " + k.key("attention.head_count");
  }
  if (c.head_dim % 2 != 0) bad(head_dim_key, std::to_string(c.head_dim), "must be even (the head dim)");
  if (int64_t(c.n_heads) * c.head_dim > kMaxInt) {
    bad(k.key("attention.head_count"), std::to_string(c.n_heads),
        fmt::format("times head dim {} exceeds {}", c.head_dim, kMaxInt));
  }
  if (k.has("attention.value_length") && k.count("attention.value_length") != c.head_dim) {
    bad(k.key("attention.value_length"), std::to_string(k.count("attention.value_length")),
        fmt::format("differs from the key head dim {} (the KV history needs one head dim)", c.head_dim));
  }
  c.rope_dim = k.count_or("rope.dimension_count", c.head_dim);
  if (c.rope_dim > c.head_dim || c.rope_dim % 2 != 0) {
    bad(k.key("rope.dimension_count"), std::to_string(c.rope_dim),
        fmt::format("must be even and <= the head dim {}", c.head_dim));
  }
}

/// Vocabulary size = rows of token_embd.weight, whose rows must be d_model
/// long; "<arch>.vocab_size" and the tokenizer's token list, when present,
/// must agree with it (llama.cpp requires the same).
void read_vocab(const gguf::File& f, const ArchKeys& k, ModelConfig& c) {
  const gguf::TensorInfo& embd = f.tensor("token_embd.weight");
  if (embd.dims.size() != 2) {
    throw Error(fmt::format("model config: token_embd.weight has {} dims, expected 2", embd.dims.size()));
  }
  if (embd.dims[0] != uint64_t(c.d_model)) {
    bad(k.key("embedding_length"), std::to_string(c.d_model),
        fmt::format("but token_embd.weight rows have {} elements", embd.dims[0]));
  }
  if (embd.dims[1] > uint64_t(kMaxInt)) {
    throw Error(fmt::format("model config: token_embd.weight has {} rows, more than {}", embd.dims[1], kMaxInt));
  }
  c.vocab_size = int(embd.dims[1]);
  if (k.has("vocab_size") && k.count("vocab_size") != c.vocab_size) {
    bad(k.key("vocab_size"), std::to_string(k.count("vocab_size")),
        fmt::format("but token_embd.weight has {} rows", c.vocab_size));
  }
  if (const gguf::Value* tokens = f.find("tokenizer.ggml.tokens")) {
    if (tokens->type != gguf::ValueType::ARRAY) {
      bad("tokenizer.ggml.tokens", tokens->to_string(),
          fmt::format("is {}, not an ARRAY", gguf::value_type_name(tokens->type)));
    }
    const size_t n = tokens->as_array().size();
    if (n != size_t(c.vocab_size)) {
      bad("tokenizer.ggml.tokens", fmt::format("({} tokens)", n),
          fmt::format("but token_embd.weight has {} rows", c.vocab_size));
    }
  }
}

/// Block index N of a tensor named "blk.N.<...>", if it is one.
std::optional<uint64_t> block_index(std::string_view name) {
  constexpr std::string_view kPrefix = "blk.";
  if (!name.starts_with(kPrefix)) return std::nullopt;
  name.remove_prefix(kPrefix.size());
  uint64_t n = 0;
  const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), n);
  if (ec != std::errc() || end == name.data() || end == name.data() + name.size() || *end != '.') {
    return std::nullopt;
  }
  return n;
}

/// block_count must match the blk.N tensors the file holds: a larger count
/// would fail later on a missing tensor, a smaller one would silently run a
/// truncated model.
void check_blocks(const gguf::File& f, const ArchKeys& k, const ModelConfig& c) {
  std::optional<uint64_t> last;
  for (const gguf::TensorInfo& t : f.tensors()) {
    if (const auto n = block_index(t.name)) last = std::max(last.value_or(0), *n);
  }
  if (!last) {
    bad(k.key("block_count"), std::to_string(c.n_layers), "but the file has no blk.N tensors");
  }
  if (*last + 1 != uint64_t(c.n_layers)) {
    bad(k.key("block_count"), std::to_string(c.n_layers),
        fmt::format("but the file's tensors are for blocks 0..{}", *last));
  }
}

/// Gemma 3's differences from llama (see docs/gemma3.md): the query scale is
/// 1/sqrt(query_pre_attn_scalar), which the GGUF carries as key_length (=
/// head_dim, already set); sliding-window layers with their own RoPE base.
void read_gemma(const ArchKeys& k, ModelConfig& c) {
  c.qk_norm = true;
  c.post_norms = true;
  c.ffn_act = FfnActivation::GeluTanh;
  c.embed_scale = float(std::sqrt(double(c.d_model)));
  c.sliding_window = k.count("attention.sliding_window");
  c.rope_base_local = k.real_above("rope.freq_base_swa", 1.0, kGemma3LocalRopeBase);
  for (int l = 0; l < c.n_layers; ++l) {
    if ((l + 1) % kGemma3SlidingPattern != 0) c.layer_attention[size_t(l)] = {c.sliding_window, c.rope_base_local};
  }
}

}  // namespace

ModelConfig ModelConfig::from_gguf(const gguf::File& f) {
  ModelConfig c;
  c.arch = f.get_string("general.architecture");
  const Architecture& arch = find_architecture(c.arch);
  c.name = f.get_string_or("general.name", "");
  const ArchKeys k(f, arch.name);
  c.n_layers = k.count("block_count");
  c.d_model = k.count("embedding_length");
  c.ffn_dim = k.count("feed_forward_length");
  c.context_length = k.count("context_length");
  read_heads(k, c);
  // RoPE rotates pair i by pos * base^(-2i/rope_dim): a base <= 1 gives no
  // decreasing frequencies (and 0 or < 0 gives inf or NaN angles).
  c.rope_base = k.real_above("rope.freq_base", 1.0, 10000.0);
  c.rms_eps = k.real_above("attention.layer_norm_rms_epsilon", 0.0, std::nullopt);
  c.rope_layout = arch.rope_layout;
  c.qkv_bias = arch.qkv_bias;
  c.query_scale = 1.0f / std::sqrt(float(c.head_dim));  // as attend_tile's default, bit for bit
  read_vocab(f, k, c);
  check_blocks(f, k, c);
  c.tied_output = f.find_tensor("output.weight") == nullptr;
  c.layer_attention.assign(size_t(c.n_layers), LayerAttention{0, c.rope_base});
  if (arch.gemma) read_gemma(k, c);
  return c;
}

int ModelConfig::n_sliding_layers() const {
  int n = 0;
  for (const LayerAttention& a : layer_attention) n += a.sliding();
  return n;
}

std::string ModelConfig::layer_split() const {
  const int sliding = n_sliding_layers();
  if (sliding == 0) return fmt::format("{} global", n_layers);
  return fmt::format("{} sliding (window {}) + {} global", sliding, sliding_window, n_layers - sliding);
}

size_t ModelConfig::kv_bytes_per_token() const {
  return 2 * size_t(n_layers) * size_t(n_kv_heads) * size_t(head_dim) * 2;
}

}  // namespace activekv::model
