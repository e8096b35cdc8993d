// One request's history on a GpuModel (gpu_model.h): its page store in pinned
// host memory sized for its own n_ctx, its device pages (placement) within
// its own GPU budget, its route and background conversion, its decode engine
// (on the model's stream), its sampler and CUDA graph. Prefill and decode are
// GpuRuntime's (gpu_runtime.h describes the data flow, placements and
// exactness); GpuModel::decode_batch advances several sequences together.
//
// Budget: the sequence's opt.gpu_kv_mem is taken from what the model's budget
// (ModelOptions::gpu_kv_mem) has left -- 0 takes what is left, capped by the
// memory free now less the margin -- and given back when it is destroyed,
// with its pages (host and device). A budget that does not fit is refused
// with one line: asked, free, and what the open sequences hold.
//
// A sequence must not outlive its model. Not thread-safe (nor is the model:
// every sequence enqueues on the model's stream).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "activekv/runtime/runtime_options.h"

namespace activekv::runtime {

class GpuModel;

class GpuSequence {
 public:
  /// Sizes the page store for opt.n_ctx tokens, allocates the sliding
  /// layers' rings, takes the budget and chooses the placement.
  /// opt.device, opt.f32_activations and opt.observer are the model's
  /// (ModelOptions): a different device or f32_activations, or an observer
  /// of its own, is InvalidArgument. Throws Error with one line when the
  /// budget does not fit the model's, and GpuRuntime's errors otherwise.
  GpuSequence(GpuModel& model, const RuntimeOptions& opt);
  ~GpuSequence();
  GpuSequence(const GpuSequence&) = delete;
  GpuSequence& operator=(const GpuSequence&) = delete;

  /// As GpuRuntime's (gpu_runtime.h).
  int32_t prefill(std::span<const int32_t> prompt, const ProgressFn& progress = {});
  /// Appends `tokens` through the prefill path without sampling (the
  /// sampler's draw count unchanged): a prompt given in pieces (a server
  /// prefills a chunk per tick) is append() for all but the last piece and
  /// prefill() for it. Note prefill() samples after every chunk of
  /// opt.prefill_chunk (GpuRuntime's behaviour), so with temperature > 0 a
  /// prompt of several chunks draws once per chunk. Throws as prefill().
  void append(std::span<const int32_t> tokens);
  int32_t decode(int32_t token);
  std::vector<float> prefill_logits(std::span<const int32_t> tokens);
  /// Logits of this sequence's last prefill()/decode()/decode_batch position,
  /// [vocab]. The model's logits buffer is shared: throws InvalidArgument if
  /// another sequence ran on the model since.
  std::vector<float> last_logits() const;
  void wait_conversions();

  int64_t n_tokens() const;
  int64_t n_ctx() const;
  HostHistory host_history() const;
  const model::ModelConfig& config() const;
  const RuntimeStats& stats() const;
  /// GPU bytes of the model's budget this sequence holds (its budget; with
  /// gpu placement, the history it keeps resident).
  size_t kv_reserved() const;
  const GpuModel& model() const;

 private:
  friend class GpuModel;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace activekv::runtime
