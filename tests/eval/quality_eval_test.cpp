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

}  // namespace
}  // namespace activekv
