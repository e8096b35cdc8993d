// A real model decoding tensor parallel over several GPUs with its history in
// the one page store (issue 15 part 3; docs/tensor-parallel.md).
//
// The weights and the forward pass split as TensorParallelForward does
// (tensor_parallel.h). The history is one page store in pinned host memory,
// whole pages (every KV head), as for one GPU. Shard i owns KV heads
// [h0, h0 + n) (kv::split_heads): per layer it writes its heads' planes of
// the new rows into the pages (device copies and, through the mapped pinned
// address, the host page), and attends its heads -- its own decode engine,
// with a head-shard AttnShape, streams only its heads' bytes of each host
// page over its device's link; prefill attends its heads of device copies.
// So each GPU moves 1/N of the history, over its own link.
//
// Compressed routes (int8s, lossless13, hybrid): pages are converted once,
// whole, by shard 0's view of the history (background threads as on one
// GPU); every shard reads the published blobs, streaming only its heads'
// parts (an int8s page's head sections; lossless13's planes).
//
// What it takes, first version (refused in one line otherwise): no CPU
// share (the engine's head shards refuse CPU pages), no observer. opt.cuda_graphs is ignored: every step runs kernel by kernel
// (the CLI refuses --cuda-graphs on with --gpus). Placement is chosen per
// shard as GpuSequence chooses it on one GPU (auto: gpu when the history
// fits, else partial) within the shard's budget: opt.gpu_kv_mem is per GPU
// (0: its free memory less the margin), split evenly between the shards on
// one GPU; shards that would land on different placements are refused.
//
// Exactness: a shard's decode attention is bitwise the single-GPU engine's
// for its heads (the same kernels, split boundaries and merge). Its prefill
// attention chooses its own key splits (fewer heads, so possibly more
// splits): equal within fp32 rounding of the merge. The row-parallel
// products sum in another order (TensorParallelForward). So logits equal
// the single-GPU runtime's within fp32 summation order, and greedy tokens
// agree unless two logits are that close.
//
// Needs CUDA GPUs. Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "activekv/gguf/gguf.h"
#include "activekv/model/config.h"
#include "activekv/runtime/runtime_options.h"

namespace activekv::runtime {

class TensorParallelRuntime {
 public:
  /// Loads shard i's weights onto devices[i] (TensorParallelForward), sizes
  /// the page store for opt.n_ctx tokens and each shard's placement. Throws
  /// InvalidArgument for options this runtime does not take (above) or a
  /// split the model does not allow, Error naming what does not fit (a
  /// shard's weights, the pinned history, a shard's GPU history), CudaError
  /// for other GPU failures.
  TensorParallelRuntime(const gguf::File& f, const model::ModelConfig& c, const RuntimeOptions& opt,
                        const std::vector<int>& devices);
  ~TensorParallelRuntime();
  TensorParallelRuntime(const TensorParallelRuntime&) = delete;
  TensorParallelRuntime& operator=(const TensorParallelRuntime&) = delete;

  /// As GpuRuntime::prefill: chunks of opt.prefill_chunk, `progress` after
  /// each; returns the token sampled after the prompt. Throws
  /// InvalidArgument for an empty prompt, a bad token id or a history past
  /// n_ctx; what was appended before an error stays.
  int32_t prefill(std::span<const int32_t> prompt, const ProgressFn& progress = {});
  /// Appends `token` and returns the token sampled after it.
  int32_t decode(int32_t token);
  /// Logits of the last position, [vocab] on the host.
  std::vector<float> last_logits() const;
  /// Blocks until background conversion has published every page full now
  /// (as GpuRuntime::wait_conversions; at once for bf16).
  void wait_conversions();

  int64_t n_tokens() const;
  int n_shards() const;
  const model::ModelConfig& config() const;
  /// Shard i's figures (its placement, the bytes it streamed and read
  /// resident, its copies); decode_steps counts every step.
  const RuntimeStats& stats(int shard) const;
  /// True when the all-reduces go through NCCL.
  bool uses_nccl() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace activekv::runtime
