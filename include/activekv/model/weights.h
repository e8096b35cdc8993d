// Model weights for the CPU forward pass.
//
// Matrices are row-major [out][in] (GGUF dims are [in, out] with dims[0]
// contiguous, so the bytes are already in this order). A layer computes
// y = x · W^T (Matrix::project). Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K
// matrices keep the file's blocks and are multiplied in them
// (model/quant_matmul.h); every other
// matrix, and every vector (norms, biases), is dequantised to fp32 at load
// (gguf::dequantize) and multiplied by OpenBLAS sgemm. ACTIVEKV_CPU_WEIGHTS=f32
// dequantises every matrix (the arithmetic before the block kernels: A/B
// runs, and the fp32 reference).
#pragma once

#include <string>
#include <vector>

#include "activekv/gguf/gguf.h"
#include "activekv/model/config.h"
#include "activekv/model/quant_matmul.h"

namespace activekv::model {

/// A weight matrix [rows = out][cols = in]: fp32, or GGUF blocks.
struct Matrix {
  int64_t rows = 0, cols = 0;
  std::vector<float> f32;  ///< [rows][cols] when dequantised; empty when quantised
  QuantMatrix quant;       ///< the blocks when quantised (quant.blocks non-empty)

  bool empty() const { return rows == 0; }
  bool quantized() const { return !quant.blocks.empty(); }
  /// y[n][rows] = x[n][cols] · W^T (dense row-major). Throws as quant_matmul.
  void project(int n, const float* x, float* y, QuantScratch& scratch) const;
  /// Row r in fp32 into out[cols] (the embedding lookup).
  void row(int64_t r, float* out) const;
};

struct LayerWeights {
  std::vector<float> attn_norm;  ///< [d_model]
  Matrix wq;                     ///< [n_heads*head_dim][d_model]
  Matrix wk;                     ///< [n_kv_heads*head_dim][d_model]
  Matrix wv;                     ///< [n_kv_heads*head_dim][d_model]
  std::vector<float> bq, bk, bv; ///< Q/K/V biases (qwen2); empty when the architecture has none
  Matrix wo;                     ///< [d_model][n_heads*head_dim]
  std::vector<float> ffn_norm;   ///< [d_model]
  Matrix w_gate;                 ///< [ffn_dim][d_model]
  Matrix w_up;                   ///< [ffn_dim][d_model]
  Matrix w_down;                 ///< [d_model][ffn_dim]
  // gemma3 only (empty otherwise). Gemma's norms compute x_hat * (1 + w);
  // llama.cpp's converter stores 1 + w in the GGUF (transformers' GGUF loader
  // subtracts the 1 again), so these are used as stored, like attn_norm.
  std::vector<float> q_norm, k_norm;                 ///< [head_dim]
  std::vector<float> post_attn_norm, post_ffn_norm;  ///< [d_model]
};

/// How Weights::load keeps matrices.
enum class WeightFormat {
  automatic,  ///< Q4_0/Q4_1/Q8_0 as blocks, the rest fp32
  f32,        ///< every matrix dequantised to fp32
};

/// WeightFormat::f32 if ACTIVEKV_CPU_WEIGHTS is "f32", automatic if it is
/// unset, empty or "auto". Throws InvalidArgument naming any other value.
WeightFormat weight_format_from_env();

/// Bytes Weights::load holds for tensor `t` in `format`: its blocks for a
/// matrix (2 dims) of a type quant_matmul computes, with `format`
/// automatic; else 4 per element (fp32).
uint64_t cpu_tensor_bytes(const gguf::TensorInfo& t, WeightFormat format);

struct Weights {
  Matrix token_embd;               ///< [vocab][d_model]
  std::vector<float> output_norm;  ///< [d_model]
  Matrix output;                   ///< [vocab][d_model]; empty when tied to token_embd
  std::vector<LayerWeights> layers;

  /// The output head matrix [vocab][d_model] (token_embd when tied).
  const Matrix& head() const { return output.empty() ? token_embd : output; }

  /// Loads every tensor the config needs (model/tensors.h) in `format`.
  /// Throws Error naming a missing tensor or one whose dims differ from the
  /// config.
  static Weights load(const gguf::File& f, const ModelConfig& c, WeightFormat format = weight_format_from_env());
};

}  // namespace activekv::model
