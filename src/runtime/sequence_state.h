// Internal to the GPU runtime: what a GpuSequence holds
// (activekv/runtime/gpu_sequence.h), seen by GpuModel::decode_batch.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <span>

#include "activekv/cuda/decode_engine.h"
#include "activekv/cuda/prefill.h"
#include "activekv/cuda/sampling.h"
#include "activekv/kv/page_store.h"
#include "activekv/route/prefill_plan.h"
#include "activekv/runtime/gpu_sequence.h"
#include "history_view.h"
#include "model_state.h"
#include "step_graph.h"

namespace activekv::runtime {

/// Throws InvalidArgument for options no sequence accepts (n_ctx,
/// prefill_chunk, cpu_share, an observer with CUDA graphs): before any
/// GPU work, so GpuRuntime calls it before loading the weights.
void check_sequence_options(const RuntimeOptions& opt, bool observer);

/// The decode engine a sequence of `opt` on model `c` runs (attention shape
/// `attn`, enqueued on the model's `stream`).
cuda::EngineConfig sequence_engine_config(const model::ModelConfig& c, const RuntimeOptions& opt,
                                          const cuda::AttnShape& attn, cudaStream_t stream);

struct GpuSequence::Impl {
  GpuModel& owner;
  GpuModel::Impl& m;  // owner's state: weights, forward, stream, budget
  const model::ModelConfig& c;
  RuntimeOptions opt;
  RuntimeStats stats;
  cuda::AttnShape attn;
  kv::KvShape kv_shape;
  int64_t pages_per_layer = 0;
  size_t reserved = 0;  // of the model's budget

  std::unique_ptr<kv::PageStore> store;
  std::unique_ptr<kv::SequenceKv> seq;
  std::unique_ptr<HistoryView> history;  // route, published pages, device copies
  std::unique_ptr<cuda::DecodeEngine> engine;
  std::unique_ptr<cuda::PrefillAttention> prefill_attn;
  std::unique_ptr<cuda::GpuSampler> sampler;
  std::unique_ptr<StepGraph> graph;  // opt.cuda_graphs with gpu placement
  bool decoded_eagerly = false;      // a decode step ran kernel by kernel (one-time initialisation done)

  int rows_cap = 0;           // rows of the largest chunk (resident or streamed)
  int32_t* ids = nullptr;     // device [rows_cap]: the rows' token ids
  int64_t* pos = nullptr;     // device [n_ctx]: 0, 1, 2, ... (a row at p reads pos + p)
  int32_t* sampled = nullptr; // device: the last sampled token
  int32_t* host_ids = nullptr;  // pinned [rows_cap + 1]: uploads, and the sampled token back
  cudaEvent_t token_ready = nullptr;
  bool sampled_valid = false;   // *sampled holds the token the last step sampled
  int32_t last_sampled = -1;
  int last_row = -1;            // row of the model's logits that holds this sequence's last ones
  uint64_t last_run = 0;        // the model's run that wrote them

  Impl(GpuModel& model, const RuntimeOptions& o);
  ~Impl();
  void build();    // the constructor's work
  void release();  // what build() took (also after it failed part way)
  cudaStream_t stream() const { return m.stream; }
  GpuForward& forward() const { return *m.forward; }
  void check_tokens(std::span<const int32_t> tokens) const;
  /// The device token id of a decode row: the last sample when `token` is
  /// it (no upload), else uploaded through host_ids.
  void stage_decode_token(int32_t token, int32_t* dst, cudaStream_t s);
  /// One chunk through the model; returns the sampled token, or -1 with
  /// `sample` false (the sampler not run: its draw count unchanged).
  int32_t run_chunk(std::span<const int32_t> tokens, bool prefill, bool all_logits, bool sample = true);
  route::PrefillPlan begin_prefill(int64_t n);
  using ChunkFn = std::function<void(size_t done, size_t n)>;
  int32_t prefill_all(std::span<const int32_t> tokens, bool all_logits, const ChunkFn& after_chunk, bool sample = true);
  void enqueue_sample(const float* logits_row);
  /// Its logits are row `row` of the model's latest run (the caller counted it in m.runs).
  void ran(int row) {
    last_row = row;
    last_run = m.runs;
  }
  int32_t fetch_sampled();
  void wait_step();  // the host waits for the stream (the step's one synchronisation)
  /// After a decode step's commit: its part of the engine's figures into stats.
  void count_decode_step(const cuda::DecodeEngine::SeqFigures& f);
  bool graph_step(bool decode) const;
};

}  // namespace activekv::runtime
