// Hyper-parameters of a Llama-family model, read from GGUF metadata.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

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

/// The activation of the gated feed-forward: act(W_gate·x) * (W_up·x).
enum class FfnActivation {
  Silu,      ///< SwiGLU (llama, qwen2)
  GeluTanh,  ///< GeGLU with the tanh approximation of GELU (gemma3)
};

/// How one layer attends (the GPU runtime keeps a sliding layer's history in a GPU ring).
struct LayerAttention {
  int window = 0;          ///< sliding window in tokens (keys in (p - window, p]); 0 = the whole history
  float rope_base = 0.0f;  ///< RoPE base of this layer
  bool sliding() const { return window > 0; }
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
  // ---- gemma3 (all off / neutral for llama and qwen2) ----
  bool qk_norm = false;        ///< per-head RMSNorm on q and k after projection (attn_{q,k}_norm)
  bool post_norms = false;     ///< RMSNorm on the attention and FFN outputs before the residual add
  FfnActivation ffn_act = FfnActivation::Silu;
  float embed_scale = 1.0f;    ///< token embeddings are multiplied by this (gemma3: sqrt(d_model))
  /// Multiplies q·k: 1/sqrt(attention.key_length) -- Gemma 3's
  /// query_pre_attn_scalar is its key length -- else 1/sqrt(head_dim).
  float query_scale = 0.0f;
  int sliding_window = 0;      ///< {arch}.attention.sliding_window (0: no local layers)
  float rope_base_local = 0.0f;  ///< RoPE base of sliding-window layers ({arch}.rope.freq_base_swa or 10000)
  std::vector<LayerAttention> layer_attention;  ///< [n_layers]

  /// Reads and validates the config. Throws Error, one line naming the key
  /// and value, for: an unsupported architecture (supported: "llama",
  /// "qwen2", "gemma3"); a missing required key (block_count, embedding_length,
  /// feed_forward_length, context_length, attention.head_count,
  /// attention.layer_norm_rms_epsilon);
  /// a count that is not an integer in [1, INT_MAX]; head_count not a
  /// multiple of head_count_kv; an odd head dim, or n_heads * head_dim over
  /// INT_MAX; value_length != key_length; rope.dimension_count odd or > head
  /// dim; an RMS epsilon that is not finite and > 0, or a RoPE base that is
  /// not finite and > 1 (both checked as float32); token_embd.weight not
  /// [embedding_length, vocab], or {arch}.vocab_size / the length of
  /// tokenizer.ggml.tokens differing from its rows; block_count differing
  /// from the blk.N tensors present; for gemma3 a missing or non-positive
  /// attention.sliding_window, or a rope.freq_base_swa that is not > 1.
  /// gemma3's layer l is global (whole history, rope.freq_base) when
  /// (l + 1) % 6 == 0 and sliding otherwise -- the pattern of llama.cpp and
  /// transformers (sliding_window_pattern 6); the GGUF does not store it.
  static ModelConfig from_gguf(const gguf::File& f);

  /// Layers with a sliding window / over the whole history.
  int n_sliding_layers() const;
  int n_global_layers() const { return n_layers - n_sliding_layers(); }
  /// "15 sliding (window 512) + 3 global", or "18 global" without local layers.
  std::string layer_split() const;

  /// Exact (bf16) KV history bytes per token over all layers: 2 (K,V) ×
  /// n_layers × n_kv_heads × head_dim × 2 bytes.
  size_t kv_bytes_per_token() const;
};

}  // namespace activekv::model
