// Tokenizer::from_gguf on small in-memory GGUF files: a good one, and one bad
// key at a time (the error must name the key).
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "activekv/gguf/gguf.h"
#include "activekv/tokenizer/tokenizer.h"
#include "internal.h"

using activekv::Tokenizer;
using activekv::gguf::ValueType;

namespace {

// The tokenizer keys of a GGUF, each optional so a test can drop or break one.
struct Keys {
  std::optional<std::string> model = "gpt2";
  std::optional<std::string> pre = "smollm";
  std::optional<std::vector<std::string>> tokens;
  std::optional<std::vector<int32_t>> types;
  std::optional<std::vector<std::string>> merges = std::vector<std::string>{"a b"};
  std::optional<uint32_t> eos;
  std::optional<std::string> chat_template;
  bool eos_as_string = false;

  Keys() {
    std::vector<std::string> t;
    for (int b = 0; b < 256; ++b)
      t.push_back(activekv::tok::byte_level_encode(std::string(1, char(b))));
    t.push_back("ab");
    t.push_back("<|im_end|>");
    tokens = t;
    types = std::vector<int32_t>(256 + 1, 1);
    types->push_back(3);
    eos = 257;
  }
};

class Writer {
 public:
  std::vector<uint8_t> bytes;
  uint64_t n_kv = 0;

  void raw(const void* p, size_t n) {
    // resize+memcpy rather than insert: GCC 12 warns falsely on the latter.
    const size_t at = bytes.size();
    bytes.resize(at + n);
    if (n != 0) std::memcpy(bytes.data() + at, p, n);
  }
  void u32(uint32_t v) { raw(&v, 4); }
  void i32(int32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void str(const std::string& s) { u64(s.size()); raw(s.data(), s.size()); }
  void type(ValueType t) { u32(static_cast<uint32_t>(t)); }

  void kv_string(const std::string& k, const std::string& v) {
    str(k); type(ValueType::STRING); str(v); ++n_kv;
  }
  void kv_u32(const std::string& k, uint32_t v) {
    str(k); type(ValueType::UINT32); u32(v); ++n_kv;
  }
  void kv_strings(const std::string& k, const std::vector<std::string>& v) {
    str(k); type(ValueType::ARRAY); type(ValueType::STRING); u64(v.size());
    for (const auto& s : v) str(s);
    ++n_kv;
  }
  void kv_i32s(const std::string& k, const std::vector<int32_t>& v) {
    str(k); type(ValueType::ARRAY); type(ValueType::INT32); u64(v.size());
    for (int32_t x : v) i32(x);
    ++n_kv;
  }
};

std::vector<uint8_t> build(const Keys& k) {
  Writer w;
  if (k.model) w.kv_string("tokenizer.ggml.model", *k.model);
  if (k.pre) w.kv_string("tokenizer.ggml.pre", *k.pre);
  if (k.tokens) w.kv_strings("tokenizer.ggml.tokens", *k.tokens);
  if (k.types) w.kv_i32s("tokenizer.ggml.token_type", *k.types);
  if (k.merges) w.kv_strings("tokenizer.ggml.merges", *k.merges);
  if (k.eos) {
    if (k.eos_as_string) w.kv_string("tokenizer.ggml.eos_token_id", "two");
    else w.kv_u32("tokenizer.ggml.eos_token_id", *k.eos);
  }
  if (k.chat_template) w.kv_string("tokenizer.chat_template", *k.chat_template);
  Writer out;
  out.raw("GGUF", 4);
  out.u32(3);
  out.u64(0);        // tensors
  out.u64(w.n_kv);   // kvs
  out.raw(w.bytes.data(), w.bytes.size());
  return out.bytes;
}

// from_gguf must throw activekv::Error whose message names `key`.
void expect_error_naming(const Keys& k, const std::string& key) {
  const auto bytes = build(k);
  const auto file = activekv::gguf::File::from_memory(bytes);
  try {
    (void)Tokenizer::from_gguf(file);
    ADD_FAILURE() << "expected an Error naming " << key;
  } catch (const activekv::Error& e) {
    EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(TokenizerGguf, ReadsTokenizerKeys) {
  Keys k;
  k.chat_template = "{{ '<|im_start|>system\nBe nice.<|im_end|>\n' }}";
  const auto bytes = build(k);
  const auto file = activekv::gguf::File::from_memory(bytes);
  const Tokenizer t = Tokenizer::from_gguf(file);
  EXPECT_EQ(t.vocab_size(), 258u);
  EXPECT_EQ(t.eos_id(), 257);
  EXPECT_EQ(t.bos_id(), -1);
  EXPECT_FALSE(t.add_bos_default());
  EXPECT_EQ(t.encode("xab<|im_end|>", true), (std::vector<int32_t>{'x', 256, 257}));
  EXPECT_TRUE(t.is_end_of_generation(257));
  EXPECT_EQ(t.default_system_message(), "Be nice.");
}

TEST(TokenizerGguf, BadKeysAreNamed) {
  { Keys k; k.model = "bert"; expect_error_naming(k, "tokenizer.ggml.model"); }
  { Keys k; k.model = "llama"; expect_error_naming(k, "tokenizer.ggml.scores"); }  // SentencePiece needs scores
  { Keys k; k.model.reset(); expect_error_naming(k, "tokenizer.ggml.model"); }
  { Keys k; k.pre = "qwen2"; expect_error_naming(k, "tokenizer.ggml.pre"); }
  { Keys k; k.tokens.reset(); expect_error_naming(k, "tokenizer.ggml.tokens"); }
  { Keys k; k.types->pop_back(); expect_error_naming(k, "tokenizer.ggml.token_type"); }
  { Keys k; k.merges.reset(); expect_error_naming(k, "tokenizer.ggml.merges"); }
  { Keys k; k.merges = std::vector<std::string>{"a q9"}; expect_error_naming(k, "tokenizer.ggml.merges"); }
  { Keys k; k.merges = std::vector<std::string>{"ab"}; expect_error_naming(k, "tokenizer.ggml.merges"); }
  { Keys k; k.eos = 9999; expect_error_naming(k, "tokenizer.ggml.eos_token_id"); }
  { Keys k; k.eos_as_string = true; expect_error_naming(k, "tokenizer.ggml.eos_token_id"); }
}
