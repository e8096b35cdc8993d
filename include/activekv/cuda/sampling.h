// Next-token sampling on the GPU: the CPU Sampler (activekv/model/sampler.h)
// with the logits left where the output head wrote them. Per step only the
// chosen token id is written (to device memory; the caller copies that one
// int to the host).
//
// Same semantics as model::Sampler, step for step (sampler.h lists them), and
// the same random numbers (activekv/model/sample_rng.h, draw index = number of
// earlier calls), so for the same logits, parameters and seed both pick the
// same token. The one difference is the order of the double sums (softmax
// normaliser, nucleus mass, running sum) and CUDA's exp against glibc's (an
// ulp): a draw that lands within ~1e-15 (relative) of a boundary between two
// candidates, or a nucleus mass within that of top_p, can go the other way --
// about (kept candidates) x 1e-15 of the draws, below 1e-9 even for a whole
// 262K vocab.
//
// How: temperature <= 0 is an argmax reduction (lowest id on ties). Otherwise
// every call sorts (logit, id) pairs with cub::DeviceRadixSort (descending,
// stable, so equal logits keep ascending ids; -0 and +0 compare equal, as on
// the CPU), computes the k probabilities over many blocks, and one block does
// the nucleus and the draw. Cost is dominated by the sort of the whole vocab.
#pragma once

#include <cstdint>
#include <memory>

#include "activekv/model/sampler.h"

typedef struct CUstream_st* cudaStream_t;

namespace activekv::cuda {

class GpuSampler {
 public:
  /// Scratch for a vocab of `vocab` logits, allocated on the current GPU:
  /// when sampling, about 30 bytes per logit with CUB's sort space (8 MB for
  /// a 262K vocab); greedy (or top_k = 1), 2 KB at most. Throws
  /// InvalidArgument for bad parameters (SamplerParams::validate) or
  /// vocab <= 0, CudaError if the GPU memory cannot be had.
  GpuSampler(int vocab, model::SamplerParams params);
  ~GpuSampler();
  GpuSampler(const GpuSampler&) = delete;
  GpuSampler& operator=(const GpuSampler&) = delete;

  /// Enqueues on `stream` the choice of the next token from logits_dev
  /// [vocab] (fp32, device) and writes its id to *token_dev (device int32).
  /// Asynchronous: returns before the GPU has run it. Calls share the scratch,
  /// so they must execute one after another (one stream, or streams ordered
  /// by the caller). Logits must be finite (see sampler.h). Throws
  /// InvalidArgument for a null pointer, CudaError if a launch fails.
  void sample(const float* logits_dev, int32_t* token_dev, cudaStream_t stream);

  /// Calls of sample() so far: the draw index the next call uses.
  uint64_t draws() const { return draws_; }
  /// Gives back the draws of enqueued calls whose tokens were discarded (a
  /// lookahead step): the next call uses draw index `draws` (<= draws(),
  /// else InvalidArgument), as if those calls had not been made.
  void rewind(uint64_t draws);
  int vocab() const { return vocab_; }
  const model::SamplerParams& params() const { return params_; }

 private:
  struct Scratch;
  int vocab_;
  model::SamplerParams params_;
  uint64_t draws_ = 0;
  std::unique_ptr<Scratch> s_;
};

}  // namespace activekv::cuda
