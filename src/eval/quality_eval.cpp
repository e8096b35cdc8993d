#include "activekv/eval/quality_eval.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "activekv/convert/compressed_history.h"
#include "activekv/core/text_file.h"
#include "activekv/model/sampler.h"
#include "activekv/eval/own_format.h"

namespace activekv::eval {
namespace {

// log-softmax of one row, in double.
void log_softmax(const float* x, size_t n, std::vector<double>& out) {
  out.resize(n);
  double m = -INFINITY;
  for (size_t i = 0; i < n; ++i) m = std::max(m, double(x[i]));
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += std::exp(double(x[i]) - m);
  const double lse = m + std::log(s);
  for (size_t i = 0; i < n; ++i) out[i] = double(x[i]) - lse;
}

struct Baseline {
  std::vector<float> logits;  // exact route, [scored][vocab]
  double nll = 0;
};

RouteQuality compare(const std::string& route, const std::string& text, const ScoredRoute& run, const Baseline& exact,
                     const std::vector<int32_t>& ids, int64_t prefix, size_t vocab) {
  const std::vector<float>& logits = run.logits;
  RouteQuality q{route, text};
  q.bytes_per_step = run.read.bytes / run.steps;
  q.bytes_per_token = q.bytes_per_step / run.mean_history;
  q.compressed_page_fraction = run.read.compressed_fraction();
  const size_t n = logits.size() / vocab;
  // Rows in parallel (Gemma 3: 262K logits a row), summed in row order: the
  // same figures whatever the thread count.
  std::vector<double> row_nll(n, 0.0), row_kl(n, 0.0);
  std::vector<char> row_agree(n, 0);
#pragma omp parallel
  {
    std::vector<double> lp, lq;
#pragma omp for schedule(static)
    for (size_t r = 0; r < n; ++r) {
      const float* a = exact.logits.data() + r * vocab;
      const float* b = logits.data() + r * vocab;
      log_softmax(a, vocab, lp);
      log_softmax(b, vocab, lq);
      const size_t next = size_t(prefix) + r + 1;
      if (next < ids.size()) row_nll[r] = -lq[size_t(ids[next])];
      double kl = 0;
      for (size_t i = 0; i < vocab; ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
      row_kl[r] = kl;
      row_agree[r] = model::argmax({a, vocab}) == model::argmax({b, vocab});
    }
  }
  double nll = 0, kl = 0;
  size_t agree = 0;
  for (size_t r = 0; r < n; ++r) {
    nll += row_nll[r];
    kl += row_kl[r];
    agree += size_t(row_agree[r]);
  }
  const size_t scored_next = std::min(n, ids.size() - size_t(prefix) - 1);
  q.ppl = std::exp(nll / double(scored_next));
  q.ppl_increase_pct = 100.0 * (q.ppl / std::exp(exact.nll / double(scored_next)) - 1.0);
  q.top1_agreement = double(agree) / double(n);
  q.mean_kl = kl / double(n);
  q.bitwise_equal_to_exact = std::memcmp(logits.data(), exact.logits.data(), logits.size() * sizeof(float)) == 0;
  return q;
}

double nll_of(const std::vector<float>& logits, const std::vector<int32_t>& ids, int64_t prefix, size_t vocab) {
  double nll = 0;
  std::vector<double> lp;
  for (size_t r = 0; r < logits.size() / vocab && size_t(prefix) + r + 1 < ids.size(); ++r) {
    log_softmax(logits.data() + r * vocab, vocab, lp);
    nll -= lp[size_t(ids[size_t(prefix) + r + 1])];
  }
  return nll;
}

// The CPU backend (cpu_scorer): one page store per text, the prefix
// prefilled and converted once, each route's scoring from the prefix on.
class CpuScorer final : public WindowScorer {
 public:
  CpuScorer(model::LlamaModel& m, const EvalConfig& cfg)
      : m_(m), cfg_(cfg), prefix_(cfg.context - cfg.scored), layers_(sampled_layers(cfg.layers_per_text, m.config())) {}

  const model::ModelConfig& config() const override { return m_.config(); }

  void begin_text(const std::string& text, const std::vector<int32_t>& ids, const Progress& say) override {
    const size_t pages = size_t((cfg_.context + cfg_.page_size - 1) / cfg_.page_size);
    text_ = text;
    ids_ = ids;
    samples_.clear();
    compressed_.reset();  // before the sequence and store it reads
    seq_.reset();
    store_ = std::make_unique<kv::PageStore>(m_.kv_shape(cfg_.page_size), pages * size_t(m_.config().n_layers));
    seq_ = std::make_unique<kv::SequenceKv>(*store_);
    if (say) say(fmt::format("{}: prefill {} tokens (exact)", text, prefix_));  // callers may pass none
    m_.prefill(std::span<const int32_t>(ids_).first(size_t(prefix_)), *seq_);
    compressed_ = std::make_unique<convert::CompressedHistory>(
        *seq_, std::vector<kv::CodecFormat>{kv::CodecFormat::lossless13, kv::CodecFormat::int8s}, pages, nullptr);
    compressed_->schedule();  // every page full after the prefix, synchronously
  }

  ScoredRoute score(const route::RouteCandidate& cand, const Progress&) override {
    ScoredRoute out;
    const bool exact = cand.config.kind == route::RouteKind::exact;
    route::RoutedView view{compressed_.get(), cand.config, &out.read};
    if (exact) {
      out.logits = score_window(view, /*capture_queries=*/true);
      sample_all_routes();  // now: the history holds the exact route's K/V of the query rows
    } else {
      out.samples = std::move(samples_[cand.name]);
      out.logits = score_window(view, false);
    }
    out.steps = double((cfg_.scored + cfg_.chunk - 1) / cfg_.chunk);
    double sum = 0;  // each forward call reads up to its last row
    for (int64_t done = 0; done < cfg_.scored; done += cfg_.chunk)
      sum += double(prefix_ + std::min<int64_t>(done + cfg_.chunk, cfg_.scored));
    out.mean_history = sum / out.steps;
    return out;
  }

 private:
  // Runs tokens [prefix, context) teacher-forced along `view`, returning
  // logits [scored][vocab]; with capture_queries, keeps the sampled layers'
  // query rows of the first chunk.
  std::vector<float> score_window(const route::RoutedView& view, bool capture_queries) {
    const model::ModelConfig& mc = m_.config();
    const size_t vocab = size_t(mc.vocab_size);
    const model::ForwardOptions saved = m_.options();
    if (capture_queries) {
      queries_.assign(size_t(mc.n_layers), {});
      model::ForwardOptions opt = saved;
      opt.on_queries = [&](int layer, int T, const float* q, const int64_t* pos) {
        if (pos[0] != prefix_ || std::find(layers_.begin(), layers_.end(), layer) == layers_.end()) return;
        const size_t n = size_t(std::min(T, cfg_.query_rows)) * size_t(mc.n_heads * mc.head_dim);
        queries_[size_t(layer)].assign(q, q + n);
      };
      m_.set_options(opt);
    }
    std::vector<float> logits(size_t(cfg_.scored) * vocab);
    seq_->truncate(prefix_);
    for (int64_t done = 0; done < cfg_.scored;) {
      const int64_t n = std::min<int64_t>(cfg_.chunk, cfg_.scored - done);
      m_.forward(std::span<const int32_t>(ids_).subspan(size_t(prefix_ + done), size_t(n)), *seq_,
                 std::span<float>(logits).subspan(size_t(done) * vocab), true, &view);
      done += n;
    }
    m_.set_options(saved);
    return logits;
  }

  // (a) every route's samples over history = the prefix + the query rows' own tokens.
  void sample_all_routes() {
    std::vector<int64_t> pos(size_t(cfg_.query_rows));
    for (int r = 0; r < cfg_.query_rows; ++r) pos[size_t(r)] = prefix_ + r;
    seq_->truncate(prefix_ + cfg_.query_rows);
    for (const route::RouteCandidate& cand : cfg_.routes) {
      for (int layer : layers_) {
        const attention::LayerHistory h{store_.get(), seq_->page_table(layer), seq_->n_tokens()};
        samples_[cand.name].push_back(own_format_sample(text_, cand, m_.config(), layer, h, layer, *compressed_,
                                                        queries_[size_t(layer)].data(), cfg_.query_rows, pos.data(),
                                                        cfg_.int8s_tile));
      }
    }
  }

  model::LlamaModel& m_;
  EvalConfig cfg_;
  int64_t prefix_;
  std::vector<int> layers_;
  std::string text_;
  std::vector<int32_t> ids_;
  std::unique_ptr<kv::PageStore> store_;
  std::unique_ptr<kv::SequenceKv> seq_;
  std::unique_ptr<convert::CompressedHistory> compressed_;
  std::vector<std::vector<float>> queries_;                    // [layer] the exact route's query rows
  std::map<std::string, std::vector<SampleError>> samples_;   // route -> its samples of this text
};

}  // namespace

void validate(const EvalConfig& c) {
  if (c.text_files.empty()) throw InvalidArgument("eval: no text files");
  // Each rule in its own words (the flags' names), not one "inconsistent sizes".
  const auto bad = [](const std::string& why) { throw InvalidArgument("eval: " + why); };
  if (c.context <= 0 || c.scored <= 0 || c.page_size <= 0 || c.chunk <= 0 || c.query_rows <= 0 || c.layers_per_text < 0)
    bad(fmt::format("sizes must be positive (context {}, scored {}, page {}, chunk {}, query rows {}, layers per text {})",
                    c.context, c.scored, c.page_size, c.chunk, c.query_rows, c.layers_per_text));
  if (c.scored >= c.context)
    bad(fmt::format("--scored {} must be below the context -c {}: the tokens before them are the prefix", c.scored,
                    c.context));
  if (c.query_rows > c.scored)
    bad(fmt::format("--query-rows {} must be at most --scored {} (the rows are scored tokens)", c.query_rows, c.scored));
}

std::vector<int> sampled_layers(int k, const model::ModelConfig& mc) {
  std::vector<int> compressible;
  for (int l = 0; l < mc.n_layers; ++l) {
    const route::RouteConfig rc = route::layer_route({route::RouteKind::int8s}, mc.layer_attention[size_t(l)].window);
    if (rc.kind != route::RouteKind::exact) compressible.push_back(l);
  }
  const int n = int(compressible.size());
  std::vector<int> out;
  for (int i = 0; i < k && n > 0; ++i)
    out.push_back(compressible[size_t(k == 1 ? 0 : std::lround(double(i) * (n - 1) / (k - 1)))]);
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<route::RouteCandidate> default_candidates() {
  std::vector<route::RouteCandidate> out;
  for (route::RouteKind k : {route::RouteKind::lossless13, route::RouteKind::int8s, route::RouteKind::hybrid})
    out.push_back({route::kind_name(k), route::RouteConfig{k}});
  return out;
}

double EvalResult::worst_sample_error(const std::string& route, bool one_term) const {
  double w = -1;
  for (const SampleError& s : samples) {
    if (s.route == route) w = std::max(w, one_term ? s.error_one_term : s.error);
  }
  return w;
}

std::unique_ptr<WindowScorer> cpu_scorer(model::LlamaModel& m, const EvalConfig& cfg) {
  validate(cfg);
  return std::make_unique<CpuScorer>(m, cfg);
}

EvalResult run_quality_eval(model::LlamaModel& m,
                            const std::function<std::vector<int32_t>(const std::string&)>& tokenize,
                            const EvalConfig& cfg, const Progress& progress) {
  return run_quality_eval(*cpu_scorer(m, cfg), tokenize, cfg, progress);
}

EvalResult run_quality_eval(WindowScorer& scorer,
                            const std::function<std::vector<int32_t>(const std::string&)>& tokenize,
                            const EvalConfig& cfg, const Progress& progress) {
  validate(cfg);
  const Progress say = [&](const std::string& line) {
    if (progress) progress(line);
  };
  const model::ModelConfig& mc = scorer.config();
  const size_t vocab = size_t(mc.vocab_size);
  const int64_t prefix = cfg.context - cfg.scored;
  EvalResult result;

  // Every text read and checked before the first is scored: a missing or
  // short later text must not cost the minutes of the earlier ones.
  std::vector<std::vector<int32_t>> windows;
  for (const std::string& path : cfg.text_files) {
    std::vector<int32_t> ids = tokenize(read_text_file(path, "eval text file"));
    if (int64_t(ids.size()) < cfg.context + 1) {
      throw Error(fmt::format("eval: '{}' has {} tokens, fewer than context {} + 1", path, ids.size(), cfg.context));
    }
    ids.resize(size_t(cfg.context) + 1);  // the window, and the token after it for the last score
    windows.push_back(std::move(ids));
  }
  for (size_t t = 0; t < cfg.text_files.size(); ++t) {
    const std::string text = std::filesystem::path(cfg.text_files[t]).filename().string();
    const std::vector<int32_t>& ids = windows[t];
    scorer.begin_text(text, ids, say);

    say(fmt::format("{}: score {} tokens along the exact route", text, cfg.scored));
    const route::RouteCandidate exact_route{"exact", {route::RouteKind::exact, cfg.recent_pages, cfg.tile_pages}};
    const ScoredRoute exact_run = scorer.score(exact_route, say);
    const Baseline exact{exact_run.logits, nll_of(exact_run.logits, ids, prefix, vocab)};
    result.routes.push_back(compare("exact", text, exact_run, exact, ids, prefix, vocab));

    for (const route::RouteCandidate& cand : cfg.routes) {
      say(fmt::format("{}: score {} tokens along the {} route", text, cfg.scored, cand.name));
      const ScoredRoute run = scorer.score(cand, say);
      result.samples.insert(result.samples.end(), run.samples.begin(), run.samples.end());
      if (!run.samples.empty())
        say(fmt::format("{}: {} own-format samples along {}, worst so far {:.5f}", text, run.samples.size(),
                        cand.name, result.worst_sample_error(cand.name)));
      result.routes.push_back(compare(cand.name, text, run, exact, ids, prefix, vocab));
    }
  }
  if (cfg.synthetic_tokens > 0) {
    say(fmt::format("synthetic: {} tokens with outlier key channels", cfg.synthetic_tokens));
    result.synthetic = synthetic_outlier_errors(
        cfg.synthetic_tokens, cfg.page_size, mc.n_kv_heads, mc.head_dim, mc.n_heads, cfg.recent_pages, cfg.tile_pages,
        cfg.int8s_tile);
  }
  return result;
}

}  // namespace activekv::eval
