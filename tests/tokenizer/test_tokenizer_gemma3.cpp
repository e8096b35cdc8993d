// Gemma 3 270M's SentencePiece-style tokenizer read from the GGUF, checked
// against tests/golden/gemma3_tokens.json (transformers' own conversion of the
// GGUF tokenizer, written by tools/reference_tokens_gemma3.py): exact ids on
// ASCII, non-ASCII, whitespace runs, special tokens and the opening of every
// text in data/texts (= ../shared/data), whole-corpus hashes, the chat format.
// Skips, saying so, when models/gemma-3-270m-q4_k_m.gguf is absent
// (scripts/setup.sh --gemma3; CI installs it).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "activekv/core/text_file.h"
#include "activekv/gguf/gguf.h"
#include "activekv/tokenizer/tokenizer.h"
#include "token_hash.h"

using activekv::ChatMessage;
using activekv::Tokenizer;

namespace {

std::string model_path() {
  const char* env = std::getenv("ACTIVEKV_MODEL_DIR");
  const std::string dir = env && *env ? env : ACTIVEKV_MODEL_DIR;
  return dir + "/gemma-3-270m-q4_k_m.gguf";
}

using activekv::testing::fnv1a64;

class Gemma3Tokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(model_path())) return;
    const auto file = activekv::gguf::File::open(model_path());
    tok_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(file));
    golden_ = nlohmann::json::parse(activekv::read_text_file(
        std::string(ACTIVEKV_SOURCE_DIR) + "/tests/golden/gemma3_tokens.json", "golden file"));
  }
  static void TearDownTestSuite() { tok_.reset(); }
  void SetUp() override {
    if (!tok_) GTEST_SKIP() << "Gemma 3 model absent: " << model_path() << " (run scripts/setup.sh --gemma3)";
  }
  static std::unique_ptr<Tokenizer> tok_;
  static nlohmann::json golden_;
};

std::unique_ptr<Tokenizer> Gemma3Tokenizer::tok_;
nlohmann::json Gemma3Tokenizer::golden_;

}  // namespace

TEST_F(Gemma3Tokenizer, Metadata) {
  EXPECT_EQ(tok_->vocab_size(), 262144u);
  EXPECT_EQ(tok_->bos_id(), golden_["bos_id"].get<int32_t>());
  EXPECT_EQ(tok_->eos_id(), golden_["eos_id"].get<int32_t>());
  EXPECT_TRUE(tok_->add_bos_default());
  EXPECT_TRUE(tok_->is_end_of_generation(1));    // <eos>
  EXPECT_TRUE(tok_->is_end_of_generation(106));  // <end_of_turn>
  EXPECT_FALSE(tok_->is_end_of_generation(105)); // <start_of_turn>
  EXPECT_EQ(tok_->token_to_piece(105), "<start_of_turn>");
  EXPECT_EQ(tok_->token_to_piece(tok_->token_id("\xE2\x96\x81the")), " the");  // U+2581 -> space
  EXPECT_EQ(tok_->token_to_piece(tok_->token_id("<0x0A>")), "\n");               // byte token
}

TEST_F(Gemma3Tokenizer, MatchesReferenceIds) {
  ASSERT_GE(golden_["cases"].size(), 25u);
  for (const auto& c : golden_["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const auto got = tok_->encode(text, false);
    EXPECT_EQ(got, c["ids"].get<std::vector<int32_t>>()) << "text: " << ::testing::PrintToString(text);
    // Lossless, except that a literal U+2581 decodes as a space (as in transformers).
    if (text.find("\xE2\x96\x81") == std::string::npos) {
      EXPECT_EQ(tok_->decode(got), text);
      std::string pieces;
      for (int32_t id : got) pieces += tok_->token_to_piece(id);
      EXPECT_EQ(pieces, text);
    }
  }
}

TEST_F(Gemma3Tokenizer, CorporaMatchReference) { activekv::testing::expect_corpora_match(*tok_, golden_["corpora"]); }

TEST_F(Gemma3Tokenizer, ChatTemplateIsGemmasTurnFormat) {
  const auto& chat = golden_["chat"];
  std::vector<ChatMessage> msgs;
  for (const auto& m : chat["messages"]) msgs.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  const std::string text = tok_->apply_chat_template(msgs, true);
  EXPECT_EQ(text, chat["expected"].get<std::string>());
  EXPECT_EQ(tok_->encode(text, true), chat["expected_ids_with_bos"].get<std::vector<int32_t>>());
  // A system message prefixes the first turn; the assistant's role is "model"; contents are trimmed.
  const std::vector<ChatMessage> conv{{"system", "Be brief."}, {"user", " hi \n"}, {"assistant", "Hello."}};
  EXPECT_EQ(tok_->apply_chat_template(conv, false),
            "<start_of_turn>user\nBe brief.\n\nhi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n");
}

TEST_F(Gemma3Tokenizer, PlainSpecialTextIsNotSpecial) {
  const auto plain = tok_->encode("<start_of_turn>", false, false);
  EXPECT_GT(plain.size(), 1u);
  EXPECT_EQ(tok_->decode(plain), "<start_of_turn>");
}
