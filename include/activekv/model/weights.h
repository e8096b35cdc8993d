// Model weights, dequantised to fp32 at load time.
//
// Matrices are row-major [out][in] (GGUF dims are [in, out] with dims[0]
// contiguous, so the bytes are already in this order). A layer computes
// y = x · W^T with gemm_nt.
#pragma once

#include <vector>

#include "activekv/gguf/gguf.h"
#include "activekv/model/config.h"

namespace activekv::model {

struct LayerWeights {
  std::vector<float> attn_norm;  ///< [d_model]
  std::vector<float> wq;         ///< [n_heads*head_dim][d_model]
  std::vector<float> wk;         ///< [n_kv_heads*head_dim][d_model]
  std::vector<float> wv;         ///< [n_kv_heads*head_dim][d_model]
  std::vector<float> bq, bk, bv; ///< Q/K/V biases (qwen2); empty when the architecture has none
  std::vector<float> wo;         ///< [d_model][n_heads*head_dim]
  std::vector<float> ffn_norm;   ///< [d_model]
  std::vector<float> w_gate;     ///< [ffn_dim][d_model]
  std::vector<float> w_up;       ///< [ffn_dim][d_model]
  std::vector<float> w_down;     ///< [d_model][ffn_dim]
  // gemma3 only (empty otherwise). Gemma's norms compute x_hat * (1 + w);
  // llama.cpp's converter stores 1 + w in the GGUF (transformers' GGUF loader
  // subtracts the 1 again), so these are used as stored, like attn_norm.
  std::vector<float> q_norm, k_norm;                 ///< [head_dim]
  std::vector<float> post_attn_norm, post_ffn_norm;  ///< [d_model]
};

struct Weights {
  std::vector<float> token_embd;   ///< [vocab][d_model]
  std::vector<float> output_norm;  ///< [d_model]
  std::vector<float> output;       ///< [vocab][d_model]; empty when tied to token_embd
  std::vector<LayerWeights> layers;

  /// The output head matrix [vocab][d_model] (token_embd when tied).
  const std::vector<float>& head() const { return output.empty() ? token_embd : output; }

  /// Dequantises every tensor the config needs (model/tensors.h). Throws
  /// Error naming a missing tensor or one whose dims differ from the config.
  static Weights load(const gguf::File& f, const ModelConfig& c);
};

}  // namespace activekv::model
