// The quality contract of SPEC §5, measured on real text with a real model.
//
// (a) own-format error: real samples -- one layer's history and its query
//     rows, from the model run on a window of real text -- read along each
//     route; error = max over rows and heads of
//     |O_kernel - O_ref|_inf / |O_ref|_inf, O_ref = fp64 attention with the
//     unquantised query over the history as the route reads it (int8s pages
//     dequantised). Plus one synthetic long case with outlier key channels,
//     where a plain per-token 8-bit key quantiser is measured beside int8s.
// (b) model-level loss against the exact route: the window's first
//     `context - scored` tokens are prefilled exactly and every full page is
//     converted (what a long prompt leaves behind); then the last `scored`
//     tokens run teacher-forced along each route. Reported per route:
//     perplexity of those tokens, its increase over exact (%), top-1
//     agreement with exact's argmax, mean KL(exact || route) in nats, and
//     whether the logits are bitwise equal to exact.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "activekv/model/llama_model.h"
#include "activekv/route/route.h"
#include "activekv/route/routed_attention.h"

namespace activekv::eval {

/// lossless13, int8s and hybrid with RouteConfig's defaults (recent 2, sink 1, tiles of 32).
std::vector<route::RouteCandidate> default_candidates();

struct EvalConfig {
  std::vector<std::string> text_files;  ///< real text, UTF-8
  int context = 8192;                   ///< window tokens (prefix + scored)
  int scored = 512;                     ///< tokens scored at the window's end
  int page_size = 1024;
  int tile_pages = 32;                   ///< the exact baseline's and the synthetic case's tiles
  int recent_pages = 2;                  ///< the synthetic case's hybrid (each route carries its own)
  int chunk = 64;                        ///< rows per teacher-forced forward
  int layers_per_text = 16;              ///< own-format samples per text (layers spread evenly)
  int query_rows = 8;                    ///< query rows per sample
  int synthetic_tokens = 65536;          ///< 0 skips the synthetic case
  /// Routes scored against exact, each with its own parameters (route::parse_candidate).
  std::vector<route::RouteCandidate> routes{default_candidates()};
  /// If set, the own-format samples and the synthetic case compute their
  /// int8s tiles with it (e.g. the GPU kernel, `eval --int8s-kernel cuda`); the
  /// teacher-forced scoring is the backend's (CPU kernels, or the GPU runtime's).
  route::Int8sTileFn int8s_tile = {};
};

/// One own-format sample.
struct SampleError {
  std::string route;
  std::string text;
  int layer = 0;
  int64_t history_tokens = 0;
  double error = 0;            ///< with the default two-term int8 query
  double error_one_term = 0;   ///< with the query in one int8 term (SPEC §3.3 as written)
};

/// The synthetic outlier case; index 0: one-term int8 query, 1: two-term.
struct SyntheticErrors {
  double separable[2] = {-1, -1};  ///< int8s along the hybrid route
  double per_token[2] = {-1, -1};  ///< plain per-token key quantiser, same middle pages
};

/// Model-level figures of one route on one text.
struct RouteQuality {
  std::string route;           ///< the candidate's name, e.g. "hybrid" or "hybrid:recent=8"
  std::string text;
  double ppl = 0;
  double ppl_increase_pct = 0;
  double top1_agreement = 0;   ///< fraction of scored positions
  double mean_kl = 0;          ///< nats
  bool bitwise_equal_to_exact = false;
  double bytes_per_step = 0;   ///< history bytes one forward step reads (all layers), mean over the scored steps
  double bytes_per_token = 0;  ///< bytes_per_step per history token the step reads (all layers): the route's cost
  double compressed_page_fraction = 0;  ///< of the history pages the scored steps read, the share read compressed
};

struct EvalResult {
  std::vector<SampleError> samples;
  std::vector<RouteQuality> routes;  ///< includes "exact" rows (the baseline)
  SyntheticErrors synthetic;
  /// Worst own-format error over the samples of `route` (-1 if none).
  double worst_sample_error(const std::string& route, bool one_term = false) const;
};

/// Called with a line of progress text.
using Progress = std::function<void(const std::string&)>;

/// One route's teacher-forced run over a text's scored tokens, as a backend measured it.
struct ScoredRoute {
  std::vector<float> logits;         ///< [scored][vocab]: row r = the logits after token prefix + r
  route::RouteReport read;           ///< pages per format and history bytes the scored steps read
  double steps = 0;                  ///< forward steps that read the history (CPU: chunks; GPU: one per token)
  double mean_history = 0;           ///< history tokens a step read, mean over the steps
  std::vector<SampleError> samples;  ///< own-format samples (a) along this route; none for exact
};

/// The model backend of run_quality_eval: runs the model over one text's
/// window. Two implement it -- the CPU forward (cpu_scorer below) and the
/// GPU runtime (eval/gpu_eval.h) -- so that one loop over texts and routes
/// makes the comparisons for both.
class WindowScorer {
 public:
  virtual ~WindowScorer() = default;
  virtual const model::ModelConfig& config() const = 0;
  /// Starts a text: `ids` = the window (cfg.context tokens) and the token after it.
  virtual void begin_text(const std::string& text, const std::vector<int32_t>& ids, const Progress& say) = 0;
  /// Scores the window's last cfg.scored tokens teacher-forced along `cand`.
  /// The first call of a text is the exact route: the own-format samples of
  /// the later calls use its queries of the first cfg.query_rows scored rows.
  virtual ScoredRoute score(const route::RouteCandidate& cand, const Progress& say) = 0;
};

/// The CPU backend: `m`'s forward over a host page store; the prefix
/// prefilled exactly and every full page converted once per text; the
/// scoring in chunks of cfg.chunk rows. Its samples read the history with
/// the exact route's K/V of the query rows (all routes sampled after exact).
std::unique_ptr<WindowScorer> cpu_scorer(model::LlamaModel& m, const EvalConfig& cfg);

/// Runs (a) and (b) with `scorer` (the CPU or the GPU backend). `tokenize`
/// turns a text file's contents into ids. Throws Error if a text is shorter
/// than `context` tokens or the config is inconsistent (scored >= context,
/// non-positive sizes).
EvalResult run_quality_eval(WindowScorer& scorer,
                            const std::function<std::vector<int32_t>(const std::string&)>& tokenize,
                            const EvalConfig& cfg, const Progress& progress);
/// The same with the CPU backend (cpu_scorer).
EvalResult run_quality_eval(model::LlamaModel& m,
                            const std::function<std::vector<int32_t>(const std::string&)>& tokenize,
                            const EvalConfig& cfg, const Progress& progress);

/// Throws InvalidArgument for an inconsistent config (what run_quality_eval checks first).
void validate(const EvalConfig& cfg);

/// k model layers spread evenly over those a compressed route reads
/// compressed (route::layer_route: a sliding-window layer is read exact, so a
/// sample there would measure nothing but the exact kernel).
std::vector<int> sampled_layers(int k, const model::ModelConfig& mc);

/// The synthetic case alone, over `n_tokens` tokens of random keys with
/// outlier channels and queries small on those channels.
SyntheticErrors synthetic_outlier_errors(int n_tokens, int page_size, int n_kv_heads, int head_dim, int n_heads,
                                         int recent_pages, int tile_pages,
                                         const route::Int8sTileFn& int8s_tile = {});

}  // namespace activekv::eval
