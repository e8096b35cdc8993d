#include "activekv/eval/quality_eval.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "activekv/core/text_file.h"
#include "activekv/model/sampler.h"
#include "activekv/eval/own_format.h"

namespace activekv::eval {
namespace {

void validate(const EvalConfig& c) {
  if (c.text_files.empty()) throw InvalidArgument("eval: no text files");
  if (c.context <= 0 || c.scored <= 0 || c.scored >= c.context || c.page_size <= 0 || c.chunk <= 0 ||
      c.query_rows <= 0 || c.query_rows > c.scored || c.layers_per_text < 0) {
    throw InvalidArgument(fmt::format("eval: inconsistent sizes (context {}, scored {}, page {}, chunk {}, rows {})",
                                      c.context, c.scored, c.page_size, c.chunk, c.query_rows));
  }
}

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

// Runs tokens [prefix, context) teacher-forced along `view`, returning logits [scored][vocab].
std::vector<float> score_window(model::LlamaModel& m, kv::SequenceKv& seq, const std::vector<int32_t>& ids,
                                int64_t prefix, const EvalConfig& cfg, const route::RoutedView& view) {
  const size_t vocab = size_t(m.config().vocab_size);
  std::vector<float> logits(size_t(cfg.scored) * vocab);
  seq.truncate(prefix);
  for (int64_t done = 0; done < cfg.scored;) {
    const int64_t n = std::min<int64_t>(cfg.chunk, cfg.scored - done);
    m.forward(std::span<const int32_t>(ids).subspan(size_t(prefix + done), size_t(n)), seq,
              std::span<float>(logits).subspan(size_t(done) * vocab), true, &view);
    done += n;
  }
  return logits;
}

// Forward calls score_window makes; each reads every history page once per layer.
double n_steps(const EvalConfig& cfg) { return double((cfg.scored + cfg.chunk - 1) / cfg.chunk); }

// Mean history length (tokens) over those calls: each reads up to its last row.
double mean_history(const EvalConfig& cfg, int64_t prefix) {
  double sum = 0;
  for (int64_t done = 0; done < cfg.scored; done += cfg.chunk) sum += double(prefix + std::min<int64_t>(done + cfg.chunk, cfg.scored));
  return sum / n_steps(cfg);
}

// k layers spread evenly over those a compressed route reads compressed
// (route::layer_route: a sliding-window layer is read exact, so a sample there
// would measure nothing but the exact kernel).
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

struct Baseline {
  std::vector<float> logits;  // exact route, [scored][vocab]
  double nll = 0;
};

RouteQuality compare(const std::string& route, const std::string& text, const std::vector<float>& logits,
                     const Baseline& exact, const std::vector<int32_t>& ids, int64_t prefix, size_t vocab,
                     const route::RouteReport& read, double steps, double history) {
  RouteQuality q{route, text};
  q.bytes_per_step = read.bytes / steps;
  q.bytes_per_token = q.bytes_per_step / history;
  q.compressed_page_fraction = read.compressed_fraction();
  const size_t n = logits.size() / vocab;
  double nll = 0, kl = 0;
  size_t agree = 0;
  std::vector<double> lp, lq;
  for (size_t r = 0; r < n; ++r) {
    const float* a = exact.logits.data() + r * vocab;
    const float* b = logits.data() + r * vocab;
    log_softmax(a, vocab, lp);
    log_softmax(b, vocab, lq);
    const size_t next = size_t(prefix) + r + 1;
    if (next < ids.size()) nll -= lq[size_t(ids[next])];
    for (size_t i = 0; i < vocab; ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
    agree += model::argmax({a, vocab}) == model::argmax({b, vocab});
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

}  // namespace

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

EvalResult run_quality_eval(model::LlamaModel& m,
                            const std::function<std::vector<int32_t>(const std::string&)>& tokenize,
                            const EvalConfig& cfg, const Progress& progress) {
  validate(cfg);
  auto say = [&](const std::string& line) {
    if (progress) progress(line);
  };
  const model::ModelConfig& mc = m.config();
  const size_t vocab = size_t(mc.vocab_size);
  const int64_t prefix = cfg.context - cfg.scored;
  const size_t pages = size_t((cfg.context + cfg.page_size - 1) / cfg.page_size);
  EvalResult result;

  for (const std::string& path : cfg.text_files) {
    const std::string text = std::filesystem::path(path).filename().string();
    std::vector<int32_t> ids = tokenize(read_text_file(path, "eval text file"));
    if (int64_t(ids.size()) < cfg.context + 1) {
      throw Error(fmt::format("eval: '{}' has {} tokens, fewer than context {} + 1", path, ids.size(), cfg.context));
    }
    ids.resize(size_t(cfg.context) + 1);  // the window, and the token after it for the last score

    kv::PageStore store(m.kv_shape(cfg.page_size), pages * size_t(mc.n_layers));
    kv::SequenceKv seq(store);
    say(fmt::format("{}: prefill {} tokens (exact)", text, prefix));
    m.prefill(std::span<const int32_t>(ids).first(size_t(prefix)), seq);
    convert::CompressedHistory compressed(seq, {kv::CodecFormat::lossless13, kv::CodecFormat::int8s}, pages, nullptr);
    compressed.schedule();  // every page full after the prefix, synchronously

    // Exact route first; capture query rows of the first scored chunk for samples.
    const std::vector<int> layers = sampled_layers(cfg.layers_per_text, mc);
    std::vector<std::vector<float>> sample_q(size_t(mc.n_layers));
    model::ForwardOptions opt = m.options();
    const model::ForwardOptions saved = opt;
    opt.on_queries = [&](int layer, int T, const float* q, const int64_t* pos) {
      if (pos[0] != prefix || std::find(layers.begin(), layers.end(), layer) == layers.end()) return;
      const size_t n = size_t(std::min(T, cfg.query_rows)) * size_t(mc.n_heads * mc.head_dim);
      sample_q[size_t(layer)].assign(q, q + n);
    };
    m.set_options(opt);
    route::RouteReport exact_report;
    route::RoutedView exact_view{&compressed, {route::RouteKind::exact, cfg.recent_pages, cfg.tile_pages}, &exact_report};
    say(fmt::format("{}: score {} tokens along the exact route", text, cfg.scored));
    Baseline exact{score_window(m, seq, ids, prefix, cfg, exact_view), 0};
    m.set_options(saved);
    exact.nll = nll_of(exact.logits, ids, prefix, vocab);
    result.routes.push_back(compare("exact", text, exact.logits, exact, ids, prefix, vocab, exact_report, n_steps(cfg),
                                    mean_history(cfg, prefix)));

    // (a) own-format samples: history = the prefix + the rows' own tokens.
    std::vector<int64_t> pos(size_t(cfg.query_rows));
    for (int r = 0; r < cfg.query_rows; ++r) pos[size_t(r)] = prefix + r;
    seq.truncate(prefix + cfg.query_rows);
    for (const route::RouteCandidate& cand : cfg.routes) {
      const route::RouteConfig& rc = cand.config;
      for (int layer : layers) {
        const attention::LayerHistory h{&store, seq.page_table(layer), seq.n_tokens()};
        const attention::QueryRows q{sample_q[size_t(layer)].data(), cfg.query_rows, mc.n_heads, pos.data()};
        // The options the forward runs this layer with (window, query scale), per query form.
        attention::AttentionOptions two = m.attention_options(layer), one = two;
        two.int8s_query_terms = 2;
        one.int8s_query_terms = 1;
        const route::RouteConfig lr = route::layer_route(rc, two.window);
        result.samples.push_back({cand.name, text, layer, seq.n_tokens(),
                                  route_own_format_error(h, layer, compressed, lr, q, two, cfg.int8s_tile),
                                  route_own_format_error(h, layer, compressed, lr, q, one, cfg.int8s_tile)});
      }
      say(fmt::format("{}: {} own-format samples along {}, worst so far {:.5f}", text, layers.size(), cand.name,
                      result.worst_sample_error(cand.name)));
    }

    // (b) each route against exact.
    for (const route::RouteCandidate& cand : cfg.routes) {
      say(fmt::format("{}: score {} tokens along the {} route", text, cfg.scored, cand.name));
      route::RouteReport report;
      route::RoutedView view{&compressed, cand.config, &report};
      const std::vector<float> logits = score_window(m, seq, ids, prefix, cfg, view);
      result.routes.push_back(compare(cand.name, text, logits, exact, ids, prefix, vocab, report, n_steps(cfg),
                                      mean_history(cfg, prefix)));
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
