// The quality eval's GPU backend. See include/activekv/eval/gpu_eval.h.
#include <fmt/format.h>

#include <algorithm>

#include "activekv/convert/compressed_history.h"
#include "activekv/core/error.h"
#include "activekv/eval/gpu_eval.h"
#include "activekv/eval/own_format.h"

namespace activekv::eval {

runtime::RuntimeOptions eval_runtime_options(const route::RouteConfig& rc, int64_t n_ctx, int page_size,
                                             const GpuEvalOptions& g) {
  runtime::RuntimeOptions o;
  o.n_ctx = n_ctx;
  o.page_size = page_size;
  o.route = rc;
  o.placement = g.placement;
  o.convert_threads = 0;  // conversion inside the step that fills a page: the same route run to run
  o.f32_activations = g.f32_activations;
  o.sampling.temperature = 0.f;  // greedy
  o.device = g.device;
  return o;
}

GpuScorer::GpuScorer(const gguf::File& f, const model::ModelConfig& c, const EvalConfig& cfg, const GpuEvalOptions& g)
    : f_(f), c_(c), cfg_(cfg), g_(g), layers_(sampled_layers(cfg.layers_per_text, c)) {
  validate(cfg_);
}

void GpuScorer::begin_text(const std::string& text, const std::vector<int32_t>& ids, const Progress&) {
  text_ = text;
  ids_ = ids;
  have_queries_ = false;
}

ScoredRoute GpuScorer::score(const route::RouteCandidate& cand, const Progress& say) {
  const bool exact = cand.config.kind == route::RouteKind::exact;
  if (!exact && !have_queries_ && !layers_.empty())
    throw Error("GpuScorer: score the exact route first (its queries are the own-format samples')");
  const int64_t prefix = cfg_.context - cfg_.scored;
  const size_t vocab = size_t(c_.vocab_size), width = size_t(c_.n_heads * c_.head_dim);
  runtime::RuntimeOptions o = eval_runtime_options(cand.config, int64_t(cfg_.context) + 1, cfg_.page_size, g_);

  // The exact run keeps the sampled layers' queries of the first query_rows
  // scored rows (decode steps: one row each).
  int capture_row = -1;
  std::vector<int> captured(size_t(c_.n_layers), 0);
  if (exact && !layers_.empty()) {
    queries_.assign(size_t(c_.n_layers), {});
    for (int l : layers_) queries_[size_t(l)].resize(size_t(cfg_.query_rows) * width);
    o.observer = [&](int layer, model::Stage stage, int T, int w, const float* rows) {
      if (capture_row < 0 || stage != model::Stage::queries || layer < 0 || queries_[size_t(layer)].empty()) return;
      if (T != 1 || size_t(w) != width) throw Error(fmt::format("GpuScorer: a decode step reported {} x {} queries", T, w));
      std::copy(rows, rows + w, queries_[size_t(layer)].begin() + std::ptrdiff_t(size_t(capture_row) * width));
      ++captured[size_t(layer)];
    };
  }
  runtime::GpuRuntime rt(f_, c_, o);
  if (say)  // callers outside run_quality_eval may pass none
    say(fmt::format("{}: {} on the GPU ({}): prefill {} tokens", text_, cand.name,
                    route::placement_name(rt.stats().placement.placement), prefix));
  rt.prefill(std::span<const int32_t>(ids_).first(size_t(prefix)));
  rt.wait_conversions();

  ScoredRoute out;
  out.logits.resize(size_t(cfg_.scored) * vocab);
  for (int r = 0; r < cfg_.scored; ++r) {
    capture_row = exact && r < cfg_.query_rows ? r : -1;
    rt.decode(ids_[size_t(prefix + r)]);
    const std::vector<float> row = rt.last_logits();
    std::copy(row.begin(), row.end(), out.logits.begin() + std::ptrdiff_t(size_t(r) * vocab));
    if (!exact && r + 1 == cfg_.query_rows) out.samples = samples(rt, cand);  // history: prefix + the query rows
  }
  capture_row = -1;
  if (exact && !layers_.empty()) {
    for (int l : layers_)
      if (captured[size_t(l)] != cfg_.query_rows)
        throw Error(fmt::format("GpuScorer: layer {} reported {} of {} query rows", l, captured[size_t(l)],
                                cfg_.query_rows));
    have_queries_ = true;
  }
  stats_ = rt.stats();
  out.read = stats_.pages;  // the decode steps' pages and bytes: the scored steps only (prefill is no decode step)
  out.steps = double(cfg_.scored);
  out.mean_history = double(prefix) + double(cfg_.scored + 1) / 2.0;  // step r reads prefix + r + 1 tokens
  return out;
}

std::vector<SampleError> GpuScorer::samples(const runtime::GpuRuntime& rt, const route::RouteCandidate& cand) const {
  const runtime::HostHistory h = rt.host_history();
  if (!h.compressed) throw Error("GpuScorer: the " + cand.name + " route's runtime has no compressed history");
  const int64_t prefix = cfg_.context - cfg_.scored;
  std::vector<int64_t> pos(size_t(cfg_.query_rows));
  for (int r = 0; r < cfg_.query_rows; ++r) pos[size_t(r)] = prefix + r;
  std::vector<SampleError> out;
  for (int layer : layers_) {
    const int g = h.store_layer.at(size_t(layer));
    const attention::LayerHistory lh{&h.seq->store(), h.seq->page_table(g), h.seq->n_tokens()};
    out.push_back(own_format_sample(text_, cand, c_, layer, lh, g, *h.compressed, queries_[size_t(layer)].data(),
                                    cfg_.query_rows, pos.data(), cfg_.int8s_tile));
  }
  return out;
}

}  // namespace activekv::eval
