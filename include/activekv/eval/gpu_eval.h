// `activekv eval --device cuda`: the quality contract (quality_eval.h) and
// the passkey check (passkey.h) with the model running through the GPU
// runtime (runtime/gpu_runtime.h) -- the path `generate --device cuda`
// decodes with: weights in their GGUF types, the global layers' history in
// pinned host pages, each decode step's pages read along the route.
//
// Per text (or passkey depth) and route, exact first: a fresh GpuRuntime with
// that route (convert_threads 0, so conversion runs inside the step that
// fills a page and every run is deterministic; greedy sampling; n_ctx for
// the window), prefill() of the prefix (the GPU prefill reads the history
// exact, as the CPU path's prefill does), wait_conversions() (every full
// page published before the scored steps, as the CPU path converts after
// its prefill), then the scored tokens teacher-forced, one decode() each:
// row r = last_logits() after token prefix + r, the rows the CPU path's
// chunked forward makes.
//
// Differences from the CPU backend, by construction:
//   - steps: one per scored token (the CPU reads the history once per chunk
//     of rows), so bytes per step are a decode step's; bytes per token and
//     the compressed page fraction are comparable. The GPU counts the global
//     layers' pages only: sliding layers live in GPU rings and are never
//     routed (the CPU path also counts their in-window pages, read exact).
//   - pages that fill during the scored steps are converted at once (the
//     CPU path converts only the prefix's pages).
//   - own-format samples: the same definition (route_own_format_error over
//     the sampled global layers, queries = the exact route's first
//     cfg.query_rows scored rows, captured through RuntimeOptions::observer);
//     the history is the route's runtime's after those rows, so its last
//     query_rows tokens' K/V are the route's own (the CPU path's are exact's).
// Needs a CUDA GPU. Not thread-safe.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "activekv/eval/passkey.h"
#include "activekv/eval/quality_eval.h"
#include "activekv/gguf/gguf.h"
#include "activekv/route/placement.h"
#include "activekv/runtime/gpu_runtime.h"

namespace activekv::eval {

/// The runtime settings an eval runs with (the rest are RuntimeOptions' defaults, what users run).
struct GpuEvalOptions {
  bool f32_activations = false;  ///< RuntimeOptions::f32_activations (default: int8 decode, bf16 prefill GEMMs)
  route::KvPlacement placement = route::KvPlacement::automatic;
  int device = 0;
};

/// The RuntimeOptions of one eval run: route `rc`, n_ctx tokens, pages of
/// page_size, convert_threads 0 (deterministic), greedy sampling.
runtime::RuntimeOptions eval_runtime_options(const route::RouteConfig& rc, int64_t n_ctx, int page_size,
                                             const GpuEvalOptions& g);

/// The GPU backend of run_quality_eval (see the file comment).
class GpuScorer final : public WindowScorer {
 public:
  /// `f` must outlive the scorer. Throws InvalidArgument for an inconsistent
  /// cfg (quality_eval.h validate); runtime errors come from score().
  GpuScorer(const gguf::File& f, const model::ModelConfig& c, const EvalConfig& cfg, const GpuEvalOptions& g = {});
  const model::ModelConfig& config() const override { return c_; }
  void begin_text(const std::string& text, const std::vector<int32_t>& ids, const Progress& say) override;
  /// Throws Error if the exact route's run did not come first (no queries
  /// for the samples), or the runtime's errors (a context that does not fit).
  ScoredRoute score(const route::RouteCandidate& cand, const Progress& say) override;
  /// The last run's runtime stats (device, placement); empty before one.
  const runtime::RuntimeStats& last_stats() const { return stats_; }

 private:
  std::vector<SampleError> samples(const runtime::GpuRuntime& rt, const route::RouteCandidate& cand) const;

  const gguf::File& f_;
  model::ModelConfig c_;
  EvalConfig cfg_;
  GpuEvalOptions g_;
  std::vector<int> layers_;                   // sampled model layers (global ones)
  std::string text_;
  std::vector<int32_t> ids_;
  std::vector<std::vector<float>> queries_;   // [model layer] the exact route's [query_rows][n_heads*head_dim]
  bool have_queries_ = false;
  runtime::RuntimeStats stats_;
};

/// The GPU backend of run_passkey: per depth and route a fresh runtime;
/// prefill() of the prefix, wait_conversions(), then the question's tokens
/// and the answer one decode() each along the route (greedy on the GPU).
class GpuPasskeyModel final : public PasskeyModel {
 public:
  /// `f` must outlive it; `context` = the passkey config's (prompt + answer).
  GpuPasskeyModel(const gguf::File& f, const model::ModelConfig& c, int context, int page_size,
                  const GpuEvalOptions& g = {});
  void begin_prompt(std::span<const int32_t> prefix) override;
  std::vector<int32_t> answer(const route::RouteConfig& rc, std::span<const int32_t> question, int n,
                              const Tokenizer& tok, route::RouteReport& read) override;
  const runtime::RuntimeStats& last_stats() const { return stats_; }

 private:
  const gguf::File& f_;
  model::ModelConfig c_;
  int context_, page_size_;
  GpuEvalOptions g_;
  std::vector<int32_t> prefix_;
  runtime::RuntimeStats stats_;
};

}  // namespace activekv::eval
