// The passkey check (eval/passkey.h) on SmolLM2 at a tiny context, small
// enough for CI: the prompt's layout, the keys' determinism, and the check
// end to end along every route.
#include "activekv/eval/passkey.h"

#include <gtest/gtest.h>

#include "../model/model_fixture.h"

namespace activekv {
namespace {

const Tokenizer& tokenizer() {
  static const Tokenizer tok = Tokenizer::from_gguf(testing::model_file());
  return tok;
}

TEST(Passkey, PromptPlantsTheKeyAtItsDepthWithinTheContext) {
  const Tokenizer& tok = tokenizer();
  const int context = 1000, answer = 10;
  int64_t prev = -1;
  for (double depth : {0.0, 0.5, 1.0}) {
    int64_t at = 0;
    const std::vector<int32_t> ids = eval::passkey_prompt(tok, "48213", depth, context, answer, &at);
    EXPECT_LE(int64_t(ids.size()) + answer, context);
    EXPECT_GT(int64_t(ids.size()) + answer, context - 40);  // at most one filler sentence short
    EXPECT_GT(at, prev);                                     // deeper is later
    prev = at;
    const std::string from_needle = tok.decode(std::span<const int32_t>(ids).subspan(size_t(at), 20));
    EXPECT_EQ(from_needle.rfind(" The pass key is 48213.", 0), 0u) << from_needle;
    const std::string text = tok.decode(ids);
    EXPECT_EQ(text.substr(text.size() - 15), "The pass key is") << text.substr(text.size() - 40);
  }
  EXPECT_THROW(eval::passkey_prompt(tok, "1", 1.5, context, answer), InvalidArgument);
  EXPECT_THROW(eval::passkey_prompt(tok, "1", 0.5, 60, answer), InvalidArgument);  // no room for filler
}

TEST(Passkey, KeysAreSeededFiveDigitNumbers) {
  const auto a = eval::passkey_keys(7, 3), b = eval::passkey_keys(7, 3), c = eval::passkey_keys(8, 3);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (const auto& k : a) EXPECT_EQ(k.size(), 5u);
}

// Measured (2-core VM, 2026-12-01): context 384, pages of 32 -- every route
// retrieves the key at all three depths and answers as exact does; lossless13
// and int8s read 11 of 12 pages compressed per step, hybrid 8 of 12 (sink,
// 2 recent, tail exact). 18 s of CPU (95 s wall on the loaded VM).
TEST(Passkey, TinyContextAlongEveryRoute) {
  eval::PasskeyConfig cfg;
  cfg.context = 384;
  cfg.page_size = 32;
  cfg.answer_tokens = 6;
  cfg.seed = 3;
  const eval::PasskeyResult r = eval::run_passkey(testing::shared_model(), tokenizer(), cfg, {});
  ASSERT_EQ(r.answers.size(), 3u * 4u);  // depths x (exact + 3 routes)
  for (const auto& a : r.answers) {
    std::printf("[measured] depth %.2f %-10s key %s answer '%s' retrieved %d agrees %d compressed %.3f\n", a.depth,
                a.route.c_str(), a.key.c_str(), a.answer.c_str(), int(a.retrieved), int(a.agrees_with_exact),
                a.compressed_page_fraction);
    EXPECT_FALSE(a.answer_ids.empty());
    EXPECT_EQ(a.retrieved, a.answer.find(a.key) != std::string::npos);
    if (a.route == "exact") {
      EXPECT_EQ(a.compressed_page_fraction, 0.0);
    } else {
      EXPECT_GT(a.compressed_page_fraction, 0.5) << a.route;  // the needle's page is read compressed
    }
    if (a.route == "lossless13") EXPECT_TRUE(a.agrees_with_exact);  // bit for bit the exact route
  }
  EXPECT_GE(r.retrieval_rate("exact"), 2.0 / 3.0);  // measured 1.0; a 135M model may miss one
  EXPECT_EQ(r.agreement_rate("exact"), 1.0);
  EXPECT_EQ(r.agreement_rate("lossless13"), 1.0);

  cfg.depths = {1.5};
  EXPECT_THROW(eval::run_passkey(testing::shared_model(), tokenizer(), cfg, {}), InvalidArgument);
  cfg.depths = {};
  EXPECT_THROW(eval::run_passkey(testing::shared_model(), tokenizer(), cfg, {}), InvalidArgument);
}

}  // namespace
}  // namespace activekv
