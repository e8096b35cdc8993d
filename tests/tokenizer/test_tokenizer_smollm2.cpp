// SmolLM2-135M-Instruct's tokenizer read from the GGUF, checked against
// tests/golden/smollm2_tokens.json (HF tokenizers reference, written by
// tools/reference_tokens.py): exact ids, round trips, chat template, speed.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "activekv/core/text_file.h"
#include "activekv/gguf/gguf.h"
#include "activekv/tokenizer/tokenizer.h"
#include "token_hash.h"

using activekv::ChatMessage;
using activekv::Tokenizer;

namespace {

const char* kModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";

std::string model_path() {
  const char* env = std::getenv("ACTIVEKV_MODEL_DIR");
  const std::string dir = env && *env ? env : ACTIVEKV_MODEL_DIR;
  return dir + "/" + kModelFile;
}

// A real text shipped in the tree (data/texts/, README there: sources,
// licences, sha256). Throws (the test fails, naming the file) if it is missing.
std::string corpus(const std::string& name) {
  return activekv::read_text_file(std::string(ACTIVEKV_SOURCE_DIR) + "/data/texts/" + name, "corpus");
}

using activekv::testing::fnv1a64;

class SmolLM2 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = model_path();
    if (!std::filesystem::exists(path)) return;
    file_ = std::make_unique<activekv::gguf::File>(activekv::gguf::File::open(path));
    tok_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(*file_));
    golden_ = nlohmann::json::parse(
        activekv::read_text_file(std::string(ACTIVEKV_SOURCE_DIR) + "/tests/golden/smollm2_tokens.json", "golden file"));
  }
  static void TearDownTestSuite() {
    tok_.reset();
    file_.reset();
  }
  void SetUp() override {
    ASSERT_TRUE(tok_) << "model file " << model_path()
                      << " is missing: run setup to download the models";
  }

  static std::unique_ptr<activekv::gguf::File> file_;
  static std::unique_ptr<Tokenizer> tok_;
  static nlohmann::json golden_;
};

std::unique_ptr<activekv::gguf::File> SmolLM2::file_;
std::unique_ptr<Tokenizer> SmolLM2::tok_;
nlohmann::json SmolLM2::golden_;

}  // namespace

TEST_F(SmolLM2, Metadata) {
  EXPECT_EQ(tok_->vocab_size(), 49152u);
  EXPECT_EQ(tok_->bos_id(), 1);
  EXPECT_EQ(tok_->eos_id(), 2);
  EXPECT_FALSE(tok_->add_bos_default());
  EXPECT_TRUE(tok_->is_end_of_generation(2));  // <|im_end|>
  EXPECT_TRUE(tok_->is_end_of_generation(0));  // <|endoftext|>
  EXPECT_FALSE(tok_->is_end_of_generation(1));
  EXPECT_FALSE(tok_->is_end_of_generation(100));
  EXPECT_EQ(tok_->token_to_piece(1), "<|im_start|>");
  EXPECT_EQ(tok_->default_system_message(),
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
}

TEST_F(SmolLM2, MatchesReferenceIds) {
  ASSERT_TRUE(golden_.contains("cases"));
  ASSERT_GE(golden_["cases"].size(), 15u);
  for (const auto& c : golden_["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const auto want = c["ids"].get<std::vector<int32_t>>();
    const auto got = tok_->encode(text, false);
    EXPECT_EQ(got, want) << "text: " << ::testing::PrintToString(text);
    EXPECT_EQ(tok_->decode(got), text);
    // Streaming pieces concatenate to the same bytes.
    std::string pieces;
    for (int32_t id : got) pieces += tok_->token_to_piece(id);
    EXPECT_EQ(pieces, text);
  }
}

TEST_F(SmolLM2, AddBosAndPlainSpecialText) {
  const auto ids = tok_->encode("hi", true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), 1);
  const auto plain = tok_->encode("<|im_start|>", false, false);
  EXPECT_GT(plain.size(), 1u);
  EXPECT_EQ(tok_->decode(plain), "<|im_start|>");
}

TEST_F(SmolLM2, DecodeRejectsOutOfRangeId) {
  const std::vector<int32_t> ids{1, 49152};
  try {
    (void)tok_->decode(ids);
    FAIL() << "expected activekv::Error";
  } catch (const activekv::Error& e) {
    EXPECT_NE(std::string(e.what()).find("49152"), std::string::npos) << e.what();
  }
}

TEST_F(SmolLM2, ChatTemplateMatchesReference) {
  const auto& chat = golden_["chat"];
  std::vector<ChatMessage> msgs;
  for (const auto& m : chat["messages"])
    msgs.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  EXPECT_EQ(tok_->apply_chat_template(msgs, true), chat["expected"].get<std::string>());
  EXPECT_EQ(tok_->apply_chat_template(msgs, false),
            chat["expected_no_generation_prompt"].get<std::string>());
}

TEST_F(SmolLM2, CorporaMatchReferenceAndRoundTrip) {
  activekv::testing::expect_corpora_match(*tok_, golden_["corpora"]);
}

TEST_F(SmolLM2, TinyShakespeareRoundTrip) {
  std::string text = corpus("tinyshakespeare.txt");
  ASSERT_GE(text.size(), 20000u);
  text.resize(20000);
  EXPECT_EQ(tok_->decode(tok_->encode(text, false)), text);
}

TEST_F(SmolLM2, ConcurrentEncodeAgrees) {
  const std::string text = corpus("tinyshakespeare.txt").substr(0, 200000);
  const auto want = tok_->encode(text, false);
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i)
    threads.emplace_back([&, i] { got[i] = Tokenizer(*tok_).encode(text, false); });
  for (auto& t : threads) t.join();
  for (const auto& g : got) EXPECT_EQ(g, want);
}

TEST_F(SmolLM2, EncodeSpeed) {
  const std::string text = corpus("pride-and-prejudice.txt");
  ASSERT_FALSE(text.empty());
  (void)tok_->encode(text.substr(0, 10000), false);  // warm up
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = tok_->encode(text, false);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double tps = ids.size() / s;
  std::printf("encode: %zu bytes -> %zu tokens in %.3f s = %.0f tokens/s\n", text.size(),
              ids.size(), s, tps);
  RecordProperty("tokens_per_second", static_cast<int>(tps));
#if defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__)
  EXPECT_GT(tps, 100000.0) << "tokenizer too slow for prefill";
#endif
}
