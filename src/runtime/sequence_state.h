// Internal to the GPU runtime: what a GpuSequence holds
// (activekv/runtime/gpu_sequence.h), seen by GpuModel::decode_batch.
#pragma once

#include <cuda_runtime.h>

#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>

#include "activekv/cuda/decode_engine.h"
#include "activekv/cuda/prefill.h"
#include "activekv/cuda/sampling.h"
#include "activekv/kv/page_store.h"
#include "activekv/route/prefill_plan.h"
#include "activekv/runtime/gpu_sequence.h"
#include "history_view.h"
#include "sequence_setup.h"
#include "model_state.h"
#include "step_graph.h"

namespace activekv::runtime {

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
  int32_t* host_ids = nullptr;  // pinned [rows_cap + 2]: uploads, then the sampled token back (two slots)
  cudaEvent_t token_ready = nullptr;
  cudaEvent_t slot_ready[2] = {nullptr, nullptr};  // after the D2H copy of a step's sampled token into its slot
  bool sampled_valid = false;   // *sampled holds the token the last step sampled
  // A failure after a batched step was kept (scheduling its conversions):
  // every later decode of this sequence throws it (decode_batch).
  std::exception_ptr deferred_error;
  int32_t last_sampled = -1;
  int last_row = -1;            // row of the model's logits that holds this sequence's last ones
  uint64_t last_run = 0;        // the model's run that wrote them

  /// A chunk enqueued on the stream and not yet committed: what finishing
  /// (or, for a lookahead step, discarding) it needs.
  struct Step {
    int64_t pos = 0;            // its first row
    int T = 1;
    bool decode = false, sample = true, graph = false;
    int logits_row = 0;         // its logits: model rows [logits_row, + logits_rows)
    int logits_rows = 1;
    int slot = 0;               // its sampled id: host_ids[rows_cap + slot], after slot_ready[slot]
    uint64_t draws_before = 0;  // the sampler's draw index before it
    uint64_t run = 0;           // the model's run (m.runs) it is
    double enqueue_s = 0;       // host time enqueuing it
    cuda::DecodeEngine::SeqFigures figures;  // the engine's figures for it (decode)
    RouteCounts route;                       // its pages per format and place (decode), counted at commit
    uint64_t route_version = 0;              // history->route_version() when its tables were built
  };
  /// Lookahead (RuntimeOptions::lookahead): the decode step enqueued after
  /// the last one returned, its token the one that step sampled on the GPU.
  std::optional<Step> ahead;
  bool lookahead = false;  // opt.lookahead, cuda_graphs, not ACTIVEKV_LOOKAHEAD=0, two logits rows;
                           // off for good after a step ahead failed to enqueue
  /// Enqueues the step after `cur` fed its token on the GPU (lookahead);
  /// false on an error: then it gives back what it drew, and this sequence
  /// stops looking ahead.
  bool enqueue_ahead(const Step& cur);

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
  /// The two halves of run_chunk. enqueue_chunk: rows [pos0, + T) (T =
  /// tokens.size(), or one decode row fed the device's last sampled token
  /// when `tokens` is empty) up to the sampled id's copy into its slot;
  /// commits nothing. finish_chunk: waits for it, commits, counts it.
  Step enqueue_chunk(std::span<const int32_t> tokens, int64_t pos0, bool prefill, bool all_logits, bool sample,
                     int slot, int logits_row);
  int32_t finish_chunk(const Step& st);
  /// A decode step of `token` at n_tokens, with lookahead where it applies.
  int32_t decode_step(int32_t token);
  /// Forgets a lookahead step (its token was not the one asked for, or a
  /// prompt comes): gives back its sampler draw; its K/V row is rewritten by
  /// whatever runs at that position next, in stream order.
  void discard_ahead();
  bool room_for(int64_t end);  // the page store holds `end` tokens (reserved now), or false
  route::PrefillPlan begin_prefill(int64_t n);
  using ChunkFn = std::function<void(size_t done, size_t n)>;
  int32_t prefill_all(std::span<const int32_t> tokens, bool all_logits, const ChunkFn& after_chunk, bool sample = true);
  /// Samples from one row of logits into `sampled`, and copies the id into host slot `slot` (0 or 1).
  void enqueue_sample(const float* logits_row, int slot = 0);
  /// Its logits are row `row` of the model's latest run (the caller counted it in m.runs).
  void ran(int row) {
    last_row = row;
    last_run = m.runs;
  }
  int32_t fetch_sampled();
  int32_t fetch_slot(int slot);  // waits for slot_ready[slot], reads the slot's sampled token
  void wait_step();  // the host waits for the stream (the step's one synchronisation)
  /// After a decode step's commit: its part of the engine's figures into stats.
  void count_decode_step(const cuda::DecodeEngine::SeqFigures& f);
  bool graph_step(bool decode) const;
};

}  // namespace activekv::runtime
