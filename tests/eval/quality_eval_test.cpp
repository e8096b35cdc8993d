// The eval pipeline end to end on a short window of real text (the repo's
// default prompt), small enough for CI: the contract's checks hold here too.
#include "activekv/eval/quality_eval.h"

#include <gtest/gtest.h>

#include "../model/model_fixture.h"
#include "activekv/tokenizer/tokenizer.h"

namespace activekv {
namespace {

TEST(QualityEval, ShortWindowMeetsTheContract) {
  model::LlamaModel& m = testing::shared_model();
  const Tokenizer tok = Tokenizer::from_gguf(testing::model_file());
  eval::EvalConfig cfg;
  cfg.text_files = {std::string(ACTIVEKV_SOURCE_DIR) + "/data/default_prompt.txt"};
  cfg.context = 768;
  cfg.scored = 64;
  cfg.page_size = 64;  // 11 full pages before the scored tokens: 8 of them int8s on the hybrid route
  cfg.chunk = 32;
  cfg.layers_per_text = 4;
  cfg.query_rows = 4;
  cfg.synthetic_tokens = 4096;
  const eval::EvalResult r = eval::run_quality_eval(
      m, [&](const std::string& t) { return tok.encode(t, false); }, cfg, [](const std::string&) {});

  ASSERT_EQ(r.routes.size(), 4u);  // exact + 3 routes
  for (const auto& q : r.routes) {
    std::printf("[measured] %-10s ppl %.4f (%+.3f%%) top-1 %.4f KL %.2e bitwise %d compressed pages %.3f\n",
                q.route.c_str(), q.ppl, q.ppl_increase_pct, q.top1_agreement, q.mean_kl,
                int(q.bitwise_equal_to_exact), q.compressed_page_fraction);
    if (q.route == "exact") {
      EXPECT_EQ(q.compressed_page_fraction, 0.0);
    } else {  // measured: 0.917 (11 of 12 pages) lossless13 and int8s, 0.708 hybrid (2 recent pages exact)
      EXPECT_GT(q.compressed_page_fraction, 0.5) << q.route;
      EXPECT_LT(q.compressed_page_fraction, 1.0) << q.route;
    }
    if (q.route == "exact" || q.route == "lossless13") {
      EXPECT_TRUE(q.bitwise_equal_to_exact) << q.route;
      EXPECT_EQ(q.ppl_increase_pct, 0.0);
    } else {
      EXPECT_FALSE(q.bitwise_equal_to_exact) << q.route << " read no compressed page";
      EXPECT_LE(q.ppl_increase_pct, 1.0) << q.route;
      EXPECT_GE(q.top1_agreement, 0.95) << q.route;  // 64 positions: at most 3 flips
    }
  }
  EXPECT_EQ(r.samples.size(), 3u * 4u);
  for (const char* route : {"int8s", "hybrid"}) {
    std::printf("[measured] %s worst own-format error %.5f (one-term query %.5f)\n", route,
                r.worst_sample_error(route), r.worst_sample_error(route, true));
    EXPECT_LE(r.worst_sample_error(route), 0.005);
    EXPECT_GT(r.worst_sample_error(route), 0.0);
  }
  EXPECT_LE(r.synthetic.separable[1], 0.005);
}

TEST(QualityEval, RejectsInconsistentSizesAndShortTexts) {
  model::LlamaModel& m = testing::shared_model();
  auto tokenize = [](const std::string& t) { return std::vector<int32_t>(t.size() / 8, 1); };
  eval::EvalConfig cfg;
  cfg.text_files = {std::string(ACTIVEKV_SOURCE_DIR) + "/data/README.md"};
  cfg.scored = cfg.context;
  EXPECT_THROW(eval::run_quality_eval(m, tokenize, cfg, {}), InvalidArgument);
  cfg.scored = 16;
  EXPECT_THROW(eval::run_quality_eval(m, tokenize, cfg, {}), Error);  // README far shorter than 8192 tokens
  cfg.text_files = {"/nonexistent/text.txt"};
  EXPECT_THROW(eval::run_quality_eval(m, tokenize, cfg, {}), Error);
}

// The loop over texts and routes with a scripted backend (what the GPU
// backend plugs into, tested without a GPU): exact first, each route's
// logits compared with exact's, its samples collected, bytes and fractions
// from its report.
class ScriptedScorer final : public eval::WindowScorer {
 public:
  explicit ScriptedScorer(int scored) : scored_(scored) { c_.vocab_size = 4; }
  const model::ModelConfig& config() const override { return c_; }
  void begin_text(const std::string&, const std::vector<int32_t>& ids, const eval::Progress&) override {
    window_ = ids.size();
  }
  eval::ScoredRoute score(const route::RouteCandidate& cand, const eval::Progress&) override {
    order.push_back(cand.name);
    eval::ScoredRoute r;
    for (int row = 0; row < scored_; ++row) r.logits.insert(r.logits.end(), {2.f, 1.f, 0.f, -1.f});
    if (cand.name == "hybrid") r.logits[1] = 3.f;  // row 0's argmax moves: 1 of scored rows disagrees
    r.read.pages[size_t(route::ReadFormat::exact)] = 1;
    r.read.pages[size_t(route::ReadFormat::int8s)] = cand.name == "exact" ? 0 : 3;
    r.read.bytes = 1000;
    r.steps = 10;
    r.mean_history = 50;
    if (cand.name != "exact") r.samples.push_back({cand.name, "t", 5, 99, 0.001, 0.002});
    return r;
  }
  std::vector<std::string> order;
  size_t window_ = 0;

 private:
  int scored_;
  model::ModelConfig c_;
};

TEST(QualityEval, OneLoopDrivesAnyBackend) {
  eval::EvalConfig cfg;
  cfg.text_files = {std::string(ACTIVEKV_SOURCE_DIR) + "/data/README.md"};
  cfg.context = 64;
  cfg.scored = 8;
  cfg.query_rows = 4;
  cfg.synthetic_tokens = 0;
  cfg.routes = {{"int8s", {route::RouteKind::int8s}}, {"hybrid", {route::RouteKind::hybrid}}};
  ScriptedScorer s(cfg.scored);
  const eval::EvalResult r = eval::run_quality_eval(
      s, [](const std::string&) { return std::vector<int32_t>(100, 1); }, cfg, {});
  EXPECT_EQ(s.order, (std::vector<std::string>{"exact", "int8s", "hybrid"}));
  EXPECT_EQ(s.window_, size_t(cfg.context + 1));  // the window and the token after it
  ASSERT_EQ(r.routes.size(), 3u);
  EXPECT_TRUE(r.routes[1].bitwise_equal_to_exact);
  EXPECT_EQ(r.routes[1].top1_agreement, 1.0);
  EXPECT_NEAR(r.routes[1].mean_kl, 0.0, 1e-15);
  EXPECT_FALSE(r.routes[2].bitwise_equal_to_exact);
  EXPECT_EQ(r.routes[2].top1_agreement, 7.0 / 8.0);
  EXPECT_GT(r.routes[2].mean_kl, 0.0);
  EXPECT_EQ(r.routes[2].bytes_per_step, 100.0);   // 1000 bytes over 10 steps
  EXPECT_EQ(r.routes[2].bytes_per_token, 2.0);    // per token of a 50-token mean history
  EXPECT_EQ(r.routes[2].compressed_page_fraction, 0.75);
  EXPECT_EQ(r.routes[0].compressed_page_fraction, 0.0);
  ASSERT_EQ(r.samples.size(), 2u);
  EXPECT_EQ(r.worst_sample_error("hybrid"), 0.001);
  EXPECT_EQ(r.worst_sample_error("hybrid", true), 0.002);
  EXPECT_EQ(r.worst_sample_error("exact"), -1.0);
}

}  // namespace
}  // namespace activekv
