// Internal to the GPU runtime: what a GpuModel holds (activekv/runtime/gpu_model.h),
// seen by its sequences (sequence_state.h) and decode_batch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "activekv/cuda/decode_engine.h"
#include "activekv/runtime/gpu_forward.h"
#include "activekv/runtime/gpu_model.h"
#include "activekv/runtime/gpu_sequence.h"
#include "activekv/runtime/gpu_weights.h"

namespace activekv::runtime {

struct GpuModel::Impl {
  model::ModelConfig c;
  ModelOptions opt;
  std::string device;
  std::unique_ptr<GpuWeights> weights;
  std::unique_ptr<GpuForward> forward;  // shared by every sequence's runs, one at a time
  std::string broken;                   // why the model can run nothing more ("" while it can): GpuModel::broken
  cudaStream_t stream = nullptr;        // every sequence's GPU work, in order
  size_t kv_budget = 0;                 // the histories' GPU budget ...
  size_t kv_reserved = 0;               // ... and what open sequences hold of it
  int open = 0;                         // open sequences
  uint64_t runs = 0;                    // forward runs so far (a sequence's logits stay valid while unchanged)
  // The sequence with a lookahead step enqueued (at most one: any other run
  // on the model discards it first, so a decode's logits are the latest).
  GpuSequence::Impl* ahead_owner = nullptr;

  // decode_batch: the rows' token ids and positions on the device (the
  // positions staged in pinned memory: one upload per step).
  int32_t* batch_ids = nullptr;     // device [kMatvecRows]
  int64_t* batch_pos = nullptr;     // device [kMatvecRows]
  int64_t* host_pos = nullptr;      // pinned [kMatvecRows]
  // decode_batch's attention: one engine for the batch (one launch per layer
  // over every sequence's page tables), made at the first batch of two or
  // more sequences with the same engine configuration; its tables per step.
  std::unique_ptr<cuda::DecodeEngine> batch_engine;
  std::vector<cuda::SeqPages> batch_tables;

  Impl(const gguf::File& f, const model::ModelConfig& cfg, const ModelOptions& o);
  ~Impl();
  std::unique_ptr<GpuForward> make_forward(int rows) const {
    return std::make_unique<GpuForward>(c, *weights, rows, opt.f32_activations, opt.observer);
  }
  /// Grows the forward's buffers to `rows` rows; false (buffers of
  /// max(fallback, opt.max_rows) rows again) when the GPU has not the memory.
  /// When not even those can be had again (another process took the memory
  /// between), the model has no buffers: `broken` says so and this and every
  /// later call throw Error.
  bool fit_rows(int rows, int fallback);
  /// What a new sequence may take of the budget: its cap. Throws Error (one
  /// line: asked, free, held) when `asked` (> 0) does not fit.
  size_t budget_cap(size_t asked) const;
};

}  // namespace activekv::runtime
