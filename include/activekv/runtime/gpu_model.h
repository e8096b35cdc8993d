// One set of weights on the GPU serving many histories (issue 16, first step).
//
// GpuModel holds what every request shares: the weights in their GGUF types,
// the forward pass's activation buffers and kernels' workspaces (sized for a
// prefill chunk, and for up to kMaxMatvecVectors decode rows), the one
// compute stream, and the GPU budget the sequences' histories share.
// GpuSequence (gpu_sequence.h) is one request's history against it: its page
// store, device pages, route, engine, sampler. GpuRuntime (gpu_runtime.h) is
// a GpuModel with one GpuSequence.
//
// decode_batch advances N <= kMaxMatvecVectors sequences by one token in one
// forward pass: the N new tokens are N rows of the shared matvecs, norms and
// RoPE (each row at its own sequence's position), so the weights are read
// once per step for all of them. Attention: when the sequences' engines have
// the same configuration (sequences opened with the same page size, tiles,
// CPU threads -- as a server opens them), one decode engine of the model's
// takes every sequence's page tables, so each layer is one launch per kernel
// and one merge for the whole batch (its device buffers -- staging ring,
// partials, work lists -- are the model's, outside the KV budget); else
// each sequence's own engine attends its row. Then each sequence's sampler
// picks its token.
//
// Exactness: the block-type matvec (the chunked kernel, the default) sums
// each vector's dot in the same order whatever n_vec, and whether its
// matrix is launched alone or grouped (Q, K, V; gate, up) -- per lane, items
// in the same order; per vector, the same warp reduction; explicit
// fmaf/mul_rn -- and the activations are quantised per 32-element block of each row, so
// a sequence decoded in a batch sees the same logits, bit for bit, as decoded
// alone (tests/cuda/test_runtime_batch.cpp holds greedy tokens and logits to
// that); the batch engine's kernels read each sequence's pages at the same
// split boundaries as its own engine and merge them in the same order. Not verified for ACTIVEKV_MATVEC_KERNEL=tiled (its CTA geometry
// depends on n_vec).
//
// All sequences' GPU work is enqueued on the model's one stream, so the
// model and its sequences are one unit: not thread-safe, one call at a time.
// Needs a CUDA GPU.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "activekv/gguf/gguf.h"
#include "activekv/model/config.h"
#include "activekv/model/llama_model.h"

namespace activekv::runtime {

class GpuSequence;

struct ModelOptions {
  int device = 0;
  /// Rows of the forward's buffers at the start (a prefill chunk); they grow
  /// when a sequence's prefill needs more (and at least kMaxMatvecVectors for decode_batch).
  int max_rows = 512;
  /// GPU bytes the sequences' histories share (the sum of their budgets,
  /// RuntimeOptions::gpu_kv_mem); 0 = the memory free once the weights and
  /// buffers are allocated, less the margin (route::default_gpu_kv_budget).
  size_t gpu_kv_mem = 0;
  /// Every projection with fp32 activations (RuntimeOptions::f32_activations).
  bool f32_activations = false;
  /// Tests: RuntimeOptions::observer, for every sequence's runs.
  model::StageObserver observer;
};

class GpuModel {
 public:
  /// Loads the weights onto GPU opt.device and allocates the forward's
  /// buffers. Throws Error naming what does not fit or is unsupported
  /// (weights, weight types, a model without a global layer) and CudaError
  /// for other GPU failures.
  GpuModel(const gguf::File& f, const model::ModelConfig& c, const ModelOptions& opt);
  ~GpuModel();
  GpuModel(const GpuModel&) = delete;
  GpuModel& operator=(const GpuModel&) = delete;

  /// One decode step for seqs[i] (1 <= N <= kMaxMatvecVectors, distinct,
  /// each made against this model, each prefilled) appending tokens[i];
  /// returns the N sampled tokens in order. Each sequence's result is the
  /// one its decode(tokens[i]) would give (see the file comment). Runs
  /// kernel by kernel (no CUDA graph). Throws InvalidArgument for a bad N,
  /// a repeated or foreign sequence, a bad token or a full context (before
  /// anything is enqueued).
  std::vector<int32_t> decode_batch(std::span<GpuSequence* const> seqs, std::span<const int32_t> tokens);

  const model::ModelConfig& config() const;
  const std::string& device_name() const;
  size_t weight_bytes() const;
  /// The GPU budget the sequences' histories share, and what open sequences hold of it.
  size_t kv_budget() const;
  size_t kv_reserved() const;
  int open_sequences() const;
  /// Why the model can run nothing more ("" while it can): its forward
  /// buffers were lost (a resize that could not be undone). A server stops on it.
  const std::string& broken() const;

 private:
  friend class GpuSequence;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace activekv::runtime
