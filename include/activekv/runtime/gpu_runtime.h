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
// Lookahead (opt.lookahead, with graphs): capturing and updating a step's
// graph costs the host ~0.5 ms (27B shape on the H200), and the host cannot
// capture step n+1 before it knows step n's token, so without lookahead the
// GPU idled that long every step (2.21 against 1.78 ms per token at depth 0). So decode(t) enqueues
// step n, then step n+1 fed the token step n samples -- on the GPU, where it
// already is -- and only then waits for step n's token. When the next
// decode() asks for that token (a generation loop), step n+1 is already
// running; any other token, a prompt or a batch discards it (its sampler
// draw given back, its K/V row written over in stream order): the results
// are the same bits with lookahead or without.
//
// Needs a CUDA GPU. Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "activekv/gguf/gguf.h"
#include "activekv/model/config.h"
#include "activekv/runtime/runtime_options.h"

namespace activekv::runtime {

class GpuModel;
class GpuSequence;

/// A GpuModel (gpu_model.h) with one GpuSequence (gpu_sequence.h): the
/// weights and one history, for generate, bench and eval.
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
  std::unique_ptr<GpuModel> model_;
  std::unique_ptr<GpuSequence> seq_;
};

}  // namespace activekv::runtime
