// The model's forward pass tensor parallel over several GPUs (issue 15 part 3;
// the split and why: docs/tensor-parallel.md).
//
// Shard i (devices[i]) holds its part of every weight (GpuWeights with the
// plan of model::plan_tensor_split: its query and KV heads' rows of Q, K, V,
// their columns of attn_output, its FFN rows, its rows of the output head)
// and runs a GpuForward on the shard's config (model::shard_config). Per
// layer the shards compute in parallel, each on its own stream, and join
// twice: the attention's output projection and the FFN's down projection
// are partial sums of d_model values, which ShardAllReduce sums (NCCL over
// distinct GPUs; a local sum for shards sharing a GPU). The residual stream
// is the same on every shard after each join. The head's logits, each
// shard's vocabulary rows, are gathered into one [rows][vocab] buffer on the
// first (home) device.
//
// Attention: the caller's, per shard -- each shard's q, k, v are its own
// heads, on its device, in the local layout ([T][q_heads][head_dim],
// [T][kv_heads][head_dim]): a shard attends the KV heads it holds
// (kv::split_heads, the decode engine's head shards) and nothing crosses.
//
// Exactness: every shard's matvecs are the single-GPU kernels on fewer
// rows, or on fewer input blocks for the two row-parallel products, whose
// per-row sums therefore add in another order than one GPU's: logits equal
// the single-GPU forward's within fp32 summation order, not bitwise.
//
// Not thread-safe. Needs CUDA GPUs; selects each shard's device while it
// works and restores the caller's current device.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "activekv/gguf/gguf.h"
#include "activekv/model/config.h"
#include "activekv/model/tensor_split.h"
#include "activekv/cuda/shard_all_reduce.h"
#include "activekv/runtime/gpu_forward.h"

namespace activekv::runtime {

/// One shard's attention of one layer: LayerAttention (gpu_forward.h) on
/// that shard's heads and device.
using ShardAttention = std::function<bool(int shard, int layer, int T, const float* q, const float* k,
                                          const float* v, float* out, cuda::Int8Blocks out_int8)>;

class TensorParallelForward {
 public:
  /// Plans the split of (f, c) over devices.size() shards and loads each
  /// shard's weights on its device, buffers for max_rows rows.
  /// `f32_activations` as GpuForward. Throws InvalidArgument for a GPU that
  /// does not exist or a split the model does not allow
  /// (model::plan_tensor_split's line), Error naming
  /// the shard and device whose weights do not fit, CudaError otherwise.
  TensorParallelForward(const gguf::File& f, const model::ModelConfig& c, const std::vector<int>& devices,
                        int max_rows, bool f32_activations = false);
  ~TensorParallelForward();
  TensorParallelForward(const TensorParallelForward&) = delete;
  TensorParallelForward& operator=(const TensorParallelForward&) = delete;

  /// GpuForward::run over the shards: ids (int32 [T]) and pos (int64 [T])
  /// on the home device, ready in home_stream()'s order; `attend` is called
  /// for every shard and layer. The logits land in rows [logits_row, ...)
  /// of logits() (home device), ordered before later work on
  /// home_stream(). Throws InvalidArgument as GpuForward::run.
  void run(const int32_t* ids, const int64_t* pos, int T, const ShardAttention& attend, bool all_logits,
           int logits_row = 0);

  /// Home device fp32 [max_rows][vocab]: the gathered logits.
  const float* logits() const { return logits_; }
  cudaStream_t home_stream() const { return stream(0); }
  cudaStream_t stream(int shard) const;
  int device(int shard) const;
  int n_shards() const { return int(shards_.size()); }
  int max_rows() const { return max_rows_; }
  const model::ModelConfig& config() const { return c_; }
  const model::TensorSplitPlan& plan() const { return plan_; }
  /// Shard i's config (model::shard_config) and the bytes of its weights on its device.
  const model::ModelConfig& shard_config(int shard) const;
  size_t weight_bytes(int shard) const;
  /// True when the all-reduces go through NCCL.
  bool uses_nccl() const;

 private:
  struct Shard;
  template <class Phase>
  void each(Phase phase);
  void run_shards(const int32_t* ids, const int64_t* pos, int T, const ShardAttention& attend, bool all_logits,
                  int logits_row);
  void join_after_error() noexcept;
  void all_reduce(int T);
  void gather_logits(int T, bool all_logits, int logits_row);

  model::ModelConfig c_;
  model::ModelTensors tensors_;
  model::TensorSplitPlan plan_;
  int max_rows_ = 0;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::unique_ptr<cuda::ShardAllReduce> reduce_;
  std::vector<float*> partials_;         // [shard] its forward's partial()
  std::vector<cudaStream_t> streams_;    // [shard] its stream
  float* logits_ = nullptr;  // home device [max_rows][vocab]
};

}  // namespace activekv::runtime
