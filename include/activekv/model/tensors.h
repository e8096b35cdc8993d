// The GGUF tensors a Llama-family model needs, found and checked once.
//
// One list for every backend: the CPU path dequantises these tensors to fp32
// (weights.h); the GPU runtime uploads the very same tensors in their GGUF
// types (activekv/runtime/gpu_weights.h). Dims are GGUF order (dims[0] is the
// contiguous one): a matrix [in, out] is `out` rows of `in` elements.
#pragma once

#include <vector>

#include "activekv/gguf/gguf.h"
#include "activekv/model/config.h"

namespace activekv::model {

/// One layer's tensors (pointers into the File's tensor list; biases null
/// when the architecture has none).
struct LayerTensors {
  const gguf::TensorInfo* attn_norm = nullptr;  ///< [d_model]
  const gguf::TensorInfo* wq = nullptr;         ///< [d_model, n_heads*head_dim]
  const gguf::TensorInfo* wk = nullptr;         ///< [d_model, n_kv_heads*head_dim]
  const gguf::TensorInfo* wv = nullptr;         ///< [d_model, n_kv_heads*head_dim]
  const gguf::TensorInfo* bq = nullptr;         ///< [n_heads*head_dim] (qwen2)
  const gguf::TensorInfo* bk = nullptr;         ///< [n_kv_heads*head_dim] (qwen2)
  const gguf::TensorInfo* bv = nullptr;         ///< [n_kv_heads*head_dim] (qwen2)
  const gguf::TensorInfo* wo = nullptr;         ///< [n_heads*head_dim, d_model]
  const gguf::TensorInfo* ffn_norm = nullptr;   ///< [d_model]
  const gguf::TensorInfo* w_gate = nullptr;     ///< [d_model, ffn_dim]
  const gguf::TensorInfo* w_up = nullptr;       ///< [d_model, ffn_dim]
  const gguf::TensorInfo* w_down = nullptr;     ///< [ffn_dim, d_model]
  const gguf::TensorInfo* q_norm = nullptr;     ///< [head_dim] (qk_norm: gemma3)
  const gguf::TensorInfo* k_norm = nullptr;     ///< [head_dim] (qk_norm: gemma3)
  const gguf::TensorInfo* post_attn_norm = nullptr;  ///< [d_model] (post_norms: gemma3)
  const gguf::TensorInfo* post_ffn_norm = nullptr;   ///< [d_model] (post_norms: gemma3)
};

struct ModelTensors {
  const gguf::TensorInfo* token_embd = nullptr;   ///< [d_model, vocab]
  const gguf::TensorInfo* output_norm = nullptr;  ///< [d_model]
  const gguf::TensorInfo* output = nullptr;       ///< [d_model, vocab]; token_embd when tied
  std::vector<LayerTensors> layers;

  /// Finds every tensor `c` needs. Throws Error naming a missing tensor or
  /// one whose dims differ from the config's ("tensor 'blk.3.attn_q.weight'
  /// has dims [576, 512], expected [576, 576]").
  static ModelTensors find(const gguf::File& f, const ModelConfig& c);
};

}  // namespace activekv::model
