// The GPU runtime's options and reports, shared by GpuRuntime (gpu_runtime.h)
// and GpuModel/GpuSequence (gpu_model.h, gpu_sequence.h): what a sequence's
// history is (context, pages, route, placement, budget), what a run reports.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "activekv/gguf/gguf.h"
#include "activekv/kv/page_store.h"
#include "activekv/model/config.h"
#include "activekv/model/llama_model.h"
#include "activekv/model/sampler.h"
#include "activekv/route/placement.h"
#include "activekv/route/residency.h"
#include "activekv/route/route.h"

namespace activekv::convert {
class CompressedHistory;
}

namespace activekv::runtime {

struct RuntimeOptions {
  int64_t n_ctx = 0;          ///< tokens the history must hold (prompt + generated); > 0
  int page_size = 1024;       ///< tokens per page
  route::RouteConfig route;   ///< kind (exact, lossless13, int8s, hybrid), recent window, tile pages
  route::KvPlacement placement = route::KvPlacement::automatic;
  size_t gpu_kv_mem = 0;      ///< GPU budget for the history in bytes; 0 = free memory less a margin
                              ///< (a GpuSequence: at most what its model's budget has left, gpu_sequence.h)
  int convert_threads = 1;    ///< background conversion threads (compressed routes); 0 = convert
                              ///< inside the step that fills a page (deterministic routes, for tests)
  int prefill_chunk = 512;    ///< tokens per prefill forward pass
  int stream_chunk = 0;       ///< tokens per prefill forward pass when the prompt's history streams
                              ///< (does not fit the GPU budget); 0 = automatic (route::choose_stream_chunk)
  int split_tokens = 0;       ///< tokens per attention CTA; 0 = the largest divisor of page_size <= 512
  bool f32_activations = false;  ///< projections with fp32 activations, prefill included (the CPU path's
                                 ///< arithmetic, slower) instead of int8 (decode) / bf16 (prefill GEMM) ones
  bool cuda_graphs = false;   ///< decode steps with `gpu` placement run as one CUDA graph each (captured
                              ///< per step, the instantiated graph updated: src/runtime/step_graph.h);
                              ///< bitwise the same results. `host` placement (copy stream, events) and
                              ///< prefill always launch kernel by kernel.
  bool lookahead = true;      ///< with cuda_graphs: while a decode step runs on the GPU, the host captures and
                              ///< launches the next one, fed the token this step samples on the GPU (the
                              ///< host's capture no longer waits between steps; gpu_sequence.cpp). A step
                              ///< whose token turns out different (teacher forcing, a new prompt) is
                              ///< discarded: the same bits as without it. ACTIVEKV_LOOKAHEAD=0 turns it off.
  /// Co-attention (host or partial placement; issue 12): the fraction of each layer's
  /// pages, oldest first, that the host CPU attends in place each decode step
  /// while the GPU streams the rest (never the tail page, never a lossless13
  /// page); 0 = none, in [0, 1); -1 = auto: the pages the planner
  /// (route/co_attention_plan.h) chooses each step from rates measured when
  /// the runtime starts (cuda/co_attention_rates.h, ~1 s). Resident pages
  /// (partial placement) are never the CPU's. Ignored with gpu placement.
  double cpu_share = 0;
  int cpu_threads = 0;        ///< CPU attention threads; 0 = hardware concurrency - 1
  model::SamplerParams sampling;
  int device = 0;  ///< with f32_activations and observer: the model's (GpuModel's ModelOptions)
  /// Tests: sees every layer's activations as the CPU forward reports them
  /// (model::StageObserver; GpuForward's constructor says how). Not with cuda_graphs.
  model::StageObserver observer;
};

/// What the summary reports.
struct RuntimeStats {
  std::string device;              ///< e.g. "NVIDIA H200"
  route::PlacementChoice placement;
  size_t weight_bytes = 0;         ///< on the GPU, in GGUF types
  size_t streamed_bytes = 0;       ///< host -> device history bytes, all decode steps
  size_t resident_bytes = 0;       ///< history bytes read in place on the GPU, all decode steps
  size_t cpu_bytes = 0;            ///< history bytes the host CPU attended in place, all decode steps
  std::string co_attention;        ///< cpu_share auto: the measured rates and the last step's plan
  // Where the global layers' pages were read, page-table entries summed over
  // all decode steps and layers (divide by decode_steps for one step).
  size_t resident_pages = 0;       ///< a device copy (gpu, partial, and every layer's tail page)
  size_t streamed_pages = 0;       ///< copied host -> device
  size_t cpu_pages = 0;            ///< attended by the host CPU (co-attention)
  route::ResidencyPlan residency;  ///< partial placement: the resident pools per layer (else empty)
  size_t residency_upload_bytes = 0;  ///< partial: host -> device bytes that made pages resident (once per page
                                      ///< and prefill; a tail page turned full moves on the GPU), all decode steps
  // Sliding-window layers (Gemma 3's local layers): their history is only a GPU ring.
  int sliding_layers = 0;          ///< layers with a window (the others are global: host pages)
  int window = 0;                  ///< their window, tokens
  size_t ring_bytes = 0;           ///< device bytes of their rings and page tables
  size_t sliding_bytes = 0;        ///< of resident_bytes: read from the rings, all decode steps
  size_t copies = 0;               ///< host -> device copies, all decode steps
  size_t decode_steps = 0;
  size_t graph_steps = 0;          ///< decode steps run as a CUDA graph (opt.cuda_graphs)
  size_t graph_instantiations = 0; ///< of them, steps whose graph had to be instantiated anew (new topology)
  size_t lookahead_steps = 0;      ///< decode steps that were already enqueued when asked for (opt.lookahead)
  size_t lookahead_discarded = 0;  ///< steps enqueued ahead and discarded (another token, a prompt, a batch)
  /// Host seconds the decode steps spent enqueuing their GPU work (page
  /// tables and patches, copies, every launch or the graph's capture and
  /// launch), all decode steps; the GPU runs meanwhile, so a step whose
  /// enqueue takes about its wall time is bound by the host, not the GPU.
  /// With lookahead a step is enqueued while the one before runs (and a
  /// discarded step's enqueue is not counted).
  double decode_enqueue_s = 0;
  size_t batched_attention_steps = 0;  ///< decode steps in a GpuModel::decode_batch whose attention ran on the
                                       ///< model's batch engine: one launch per layer for every sequence of the batch
  route::RouteReport pages;        ///< pages per format and segments read, all decode steps
  // The last prefill (activekv/route/prefill_plan.h).
  bool prefill_streamed = false;   ///< its history streamed from host memory (did not fit the GPU budget)
  int prefill_chunk = 0;           ///< tokens per chunk
  int64_t prefill_staging_pages = 0;  ///< streamed: pages per staging buffer (two buffers)
  size_t prefill_moved_bytes = 0;  ///< streamed: history bytes copied host -> device, all its chunks
};

using ProgressFn = std::function<void(int64_t done, int64_t total)>;

/// The global layers' history in host memory as the route reads it, for
/// evaluation (`eval --device cuda`'s own-format samples) and tests. Read
/// only; valid until the next prefill()/decode() or the runtime's end.
struct HostHistory {
  const kv::SequenceKv* seq = nullptr;               ///< its store layer g = the g-th global model layer
  convert::CompressedHistory* compressed = nullptr;  ///< the route's published pages; nullptr for exact
  std::vector<int> store_layer;                      ///< [model layer] its store layer; -1: a sliding layer
};

}  // namespace activekv::runtime
