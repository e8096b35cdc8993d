// A model's weights on the GPU, in their GGUF types (SPEC §8: never expanded
// to fp32 on host or GPU).
//
// Every matrix is uploaded once, its bytes as in the file, into one device
// allocation, and read by the quantised matvec and GEMM kernels of
// activekv/cuda/quant_matvec.h. Matrices of Q4_0, Q4_1, Q5_0, Q8_0 and Q6_K
// are stored in the split layout (cuda::WeightLayout: the same bytes, the
// codes 16-byte aligned for the matvec), repacked on the GPU through a scratch
// buffer the size of the largest of them; ACTIVEKV_WEIGHT_LAYOUT=gguf keeps
// every matrix as in the file (for A/B measurements). The norm weights and
// biases (vectors of a few thousand values) are widened to fp32 on upload,
// since the row kernels read them as fp32. Before anything is allocated the
// constructor checks that every matrix has a GPU kernel and that the bytes
// (and the repack's scratch) fit the free device memory, and says which
// tensor or how many bytes when not.
//
// Tensor parallel (issue 15, docs/tensor-parallel.md): given a split plan and
// a shard, only that shard's part of each tensor is uploaded -- the rows of
// its heads and FFN rows, the input columns of attn_output and ffn_down
// (whole quant blocks, copied row by row from the file's bytes), the rows of
// its vocabulary slice of the head -- and the matrices' rows and cols are
// those of the part; norms and the token embedding whole.
#pragma once

#include <string>
#include <vector>

#include "activekv/cuda/quant_matvec.h"
#include "activekv/gguf/gguf.h"
#include "activekv/model/config.h"

namespace activekv::model {
struct TensorSplitPlan;
}

namespace activekv::runtime {

struct GpuLayerWeights {
  const float* attn_norm = nullptr;  ///< [d_model] fp32
  cuda::DeviceMatrix wq, wk, wv, wo;
  const float* bq = nullptr;  ///< [n_heads*head_dim] fp32, or null (no bias)
  const float* bk = nullptr;
  const float* bv = nullptr;
  const float* ffn_norm = nullptr;
  cuda::DeviceMatrix w_gate, w_up, w_down;
  // gemma3 (null otherwise), fp32, used as stored (the GGUF holds 1 + w).
  const float* q_norm = nullptr;          ///< [head_dim]
  const float* k_norm = nullptr;          ///< [head_dim]
  const float* post_attn_norm = nullptr;  ///< [d_model]
  const float* post_ffn_norm = nullptr;   ///< [d_model]
};

class GpuWeights {
 public:
  /// Uploads the tensors of model::ModelTensors::find(f, c) to the current
  /// device: all of them, or with `split` (made for f and c) shard `shard`'s
  /// part. Throws Error naming a tensor whose type has no GPU kernel, or
  /// the bytes needed against the bytes free ("weights need 3.25 GiB, 1.10
  /// GiB free on NVIDIA H200"), InvalidArgument for a shard outside the
  /// split, and CudaError for other CUDA failures.
  GpuWeights(const gguf::File& f, const model::ModelConfig& c, const model::TensorSplitPlan* split = nullptr,
             int shard = 0);
  ~GpuWeights();
  GpuWeights(const GpuWeights&) = delete;
  GpuWeights& operator=(const GpuWeights&) = delete;

  /// Device bytes the upload takes (matrices as stored + fp32 vectors; a shard's part with `split`).
  static size_t bytes_needed(const gguf::File& f, const model::ModelConfig& c,
                             const model::TensorSplitPlan* split = nullptr, int shard = 0);

  cuda::DeviceMatrix token_embd;  ///< [vocab] rows of d_model
  cuda::DeviceMatrix output;      ///< the head: token_embd when tied
  const float* output_norm = nullptr;
  std::vector<GpuLayerWeights> layers;

  size_t bytes() const { return bytes_; }
  /// Bytes of the matrices a decode step reads (every layer's and the head).
  size_t matrix_bytes_per_token() const { return matrix_bytes_; }

 private:
  void* base_ = nullptr;
  size_t bytes_ = 0, matrix_bytes_ = 0;
};

}  // namespace activekv::runtime
