// Hyper-parameters of a Llama-family model, read from GGUF metadata.
#pragma once

#include <cstddef>
#include <string>

#include "activekv/gguf/gguf.h"

namespace activekv::model {

/// How RoPE pairs the channels of a head.
enum class RopeLayout {
  /// llama.cpp "normal": rotate pairs (2i, 2i+1). GGUF llama checkpoints store
  /// Q/K rows permuted for this layout (convert_hf_to_gguf.py permutes them).
  Interleaved,
  /// GPT-NeoX style: rotate pairs (i, i + rope_dim/2).
  HalfSplit,
};

struct ModelConfig {
  std::string arch;        ///< general.architecture, e.g. "llama"
  std::string name;        ///< general.name (may be empty)
  int n_layers = 0;        ///< {arch}.block_count
  int d_model = 0;         ///< {arch}.embedding_length
  int n_heads = 0;         ///< {arch}.attention.head_count
  int n_kv_heads = 0;      ///< {arch}.attention.head_count_kv (defaults to n_heads)
  int head_dim = 0;        ///< {arch}.attention.key_length or d_model / n_heads
  int ffn_dim = 0;         ///< {arch}.feed_forward_length
  int vocab_size = 0;      ///< rows of token_embd.weight
  int context_length = 0;  ///< {arch}.context_length (trained context, tokens)
  int rope_dim = 0;        ///< {arch}.rope.dimension_count (defaults to head_dim)
  float rope_base = 10000.0f;  ///< {arch}.rope.freq_base (defaults to 10000)
  float rms_eps = 1e-5f;       ///< {arch}.attention.layer_norm_rms_epsilon (required)
  RopeLayout rope_layout = RopeLayout::Interleaved;
  bool tied_output = false;    ///< no output.weight: the head reuses token_embd.weight
  bool qkv_bias = false;       ///< Q/K/V projections carry biases (qwen2)

  /// Reads and validates the config. Throws Error, one line naming the key
  /// and value, for: an unsupported architecture (supported: "llama",
  /// "qwen2"); a missing required key (block_count, embedding_length,
  /// feed_forward_length, context_length, attention.head_count,
  /// attention.layer_norm_rms_epsilon);
  /// a count that is not an integer in [1, INT_MAX]; head_count not a
  /// multiple of head_count_kv; an odd head dim, or n_heads * head_dim over
  /// INT_MAX; value_length != key_length; rope.dimension_count odd or > head
  /// dim; an RMS epsilon that is not finite and > 0, or a RoPE base that is
  /// not finite and > 1 (both checked as float32); token_embd.weight not
  /// [embedding_length, vocab], or {arch}.vocab_size / the length of
  /// tokenizer.ggml.tokens differing from its rows; block_count differing
  /// from the blk.N tensors present.
  static ModelConfig from_gguf(const gguf::File& f);

  /// Exact (bf16) KV history bytes per token over all layers: 2 (K,V) ×
  /// n_layers × n_kv_heads × head_dim × 2 bytes.
  size_t kv_bytes_per_token() const;
};

}  // namespace activekv::model
