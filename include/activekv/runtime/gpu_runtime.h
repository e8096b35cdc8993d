// One runtime: a real model decoding on the GPU with its KV history in the
// one page store in pinned host memory (SPEC §8, issue "One runtime").
//
// Data flow of one decode step (nothing crosses back but the sampled token):
//   the token (already on the GPU: the last step's sample) -> embedding ->
//   per layer: RMSNorm, Q/K/V in the weights' GGUF types, RoPE; the new
//   token's K/V go, as bf16, into the tail page on the GPU and -- by the same
//   kernel, through the mapped pinned address -- into its page of the host
//   store; attention over the layer's history runs in the decode engine
//   (activekv/cuda/decode_engine.h): pages resident on the GPU are read in
//   place, the others stream from the host store while earlier layers
//   compute; Wo, FFN -> head -> GPU sampler -> the token id, 4 bytes, to the
//   host. The route (SPEC §2) chooses per page which format the step reads:
//   bf16, or a page that background conversion published in the pinned
//   arena as int8s or lossless13.
//
// Placement (activekv/route/placement.h): `gpu` keeps a device copy of every
// page (and of every published encoded page the route reads); `host` keeps
// only each layer's tail page on the GPU and streams every full page every
// step; `partial` (auto's choice when the history does not fit the budget)
// keeps the tail and, within the budget, the hot pages route/residency.h
// chooses each step (sink, recent window, then the newest others; an int8s
// page as its encoded copy) and streams the rest -- or gives its oldest
// pages to the host CPU with co-attention (cpu_share). Prefill runs on the GPU in chunks of full-model GEMMs, the chunk's
// attention over device copies of the history (with `host`, those copies are
// freed once the prompt is done). With `host`, a prompt whose history does
// not fit the GPU budget streams instead (activekv/route/prefill_plan.h):
// only the pages a chunk writes live on the GPU, and each chunk's attention
// reads every layer's earlier pages from the host store through two staging
// buffers, copied on a copy stream while the other buffer is attended. When
// a buffer holds a layer's whole history the result is bitwise the resident
// one; otherwise the history is attended in segments whose (O, LSE) partials
// merge exactly (SPEC §4), equal within fp32 rounding of the merge and the
// kernel's split-dependent rounding (tests/cuda/test_runtime.cpp). Streamed
// chunks are larger (opt.stream_chunk): every chunk re-reads the history.
//
// Sliding-window layers (ModelConfig::layer_attention, Gemma 3's local
// layers): a layer with window W attends keys (p - W, p] only, so its
// history is kept only as a ring of device pages holding the last W tokens
// and a chunk (src/runtime/sliding_ring.h) -- never in host pages, never
// streamed, converted or routed; prefill and decode attend it in place with
// the window. Only the global layers' history is in the page store (store
// layer g = the g-th global layer) and streams, converts and routes as for
// llama. stats() says how many layers slide and what their rings cost.
//
// Exactness: the decode engine reads the same bytes with the same kernels
// and split boundaries whatever the placement, so `host` and `gpu` decode
// steps give bitwise identical attention, and the same tokens.
//
// CUDA graphs (opt.cuda_graphs): a decode step with `gpu` placement is
// captured whole -- the token id already on the GPU through every layer,
// the head and the sampler -- and launched as one graph; the step's
// host-side preparation (device page copies, page-table and work-list
// patches, which read host memory that changes) stays outside the capture.
// The first decode step of a runtime runs eagerly: one-time initialisation
// (kernel attributes) happens outside any capture.
//
// Needs a CUDA GPU. Not thread-safe.
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
  int device = 0;
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

class GpuRuntime {
 public:
  /// Loads the weights onto GPU `opt.device` in their GGUF types, sizes the
  /// page store (pinned, global layers) for opt.n_ctx tokens, allocates the
  /// sliding layers' rings and chooses the placement. Throws Error with one
  /// line naming what does not fit (weights, pinned history, rings, GPU
  /// history) or is unsupported (weight type, head dim, GQA group, page
  /// format, a model without a global layer, opt.observer with
  /// cuda_graphs) and CudaError for other GPU failures.
  GpuRuntime(const gguf::File& f, const model::ModelConfig& c, const RuntimeOptions& opt);
  ~GpuRuntime();
  GpuRuntime(const GpuRuntime&) = delete;
  GpuRuntime& operator=(const GpuRuntime&) = delete;

  /// Appends the prompt (chunks of opt.prefill_chunk, or of the streamed
  /// chunk when its history does not fit the GPU budget; `progress` after
  /// each) and returns the token sampled from its last position. Throws
  /// InvalidArgument for an empty prompt, a bad token id or a history past
  /// n_ctx, Error with the sizes when not even a streamed prefill fits the
  /// budget; what was already appended stays.
  int32_t prefill(std::span<const int32_t> prompt, const ProgressFn& progress = {});
  /// Appends `token` and returns the token sampled after it (one decode step).
  int32_t decode(int32_t token);

  /// Appends `tokens` through the prefill path and returns the logits of
  /// every one of them, [n][vocab] on the host (tests and evaluation).
  std::vector<float> prefill_logits(std::span<const int32_t> tokens);
  /// Logits of the last prefill()/decode() position, [vocab] on the host.
  std::vector<float> last_logits() const;
  /// Blocks until background conversion (compressed routes) has encoded and
  /// published every page that is full now, so that the next decode steps
  /// read the route's steady state (a benchmark's wait; decode itself never
  /// waits). Returns at once for bf16 or when nothing is queued.
  void wait_conversions();

  int64_t n_tokens() const;
  /// See HostHistory. With convert_threads > 0, call wait_conversions() first
  /// (background conversion publishes pages while it runs).
  HostHistory host_history() const;
  const model::ModelConfig& config() const;
  const RuntimeStats& stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace activekv::runtime
