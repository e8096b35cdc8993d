// Tokenizer::from_gguf: reads the tokenizer.* keys of a GGUF file.
#include <fmt/format.h>

#include "activekv/gguf/gguf.h"
#include "internal.h"

namespace activekv {

namespace {

[[noreturn]] void bad_key(std::string_view key, const std::string& problem) {
  throw Error(fmt::format("GGUF tokenizer: key '{}': {}", key, problem));
}

std::vector<std::string> string_array(const gguf::File& f, std::string_view key) {
  std::vector<std::string> out;
  try {
    const auto& arr = f.get_array(key);
    out.reserve(arr.size());
    for (const auto& v : arr) out.push_back(v.as_string());
  } catch (const Error& e) {
    bad_key(key, e.what());
  }
  return out;
}

int32_t optional_id(const gguf::File& f, std::string_view key, size_t n_tokens) {
  if (f.find(key) == nullptr) return -1;
  uint64_t id = 0;
  try {
    id = f.get_u64(key);
  } catch (const Error& e) {
    bad_key(key, e.what());
  }
  if (id >= n_tokens) bad_key(key, fmt::format("id {} is out of range [0, {})", id, n_tokens));
  return static_cast<int32_t>(id);
}

// The SentencePiece keys: one score per token; no space prefix (we do not
// implement llama.cpp's prefix rule: Gemma 3's GGUF says false).
void read_sentencepiece(const gguf::File& f, Tokenizer::Vocab& v) {
  constexpr std::string_view kScores = "tokenizer.ggml.scores";
  try {
    const auto& arr = f.get_array(kScores);
    v.scores.reserve(arr.size());
    for (const auto& s : arr) v.scores.push_back(static_cast<float>(s.as_f64()));
  } catch (const Error& e) {
    bad_key(kScores, e.what());
  }
  if (v.scores.size() != v.tokens.size())
    bad_key(kScores, fmt::format("{} scores for {} tokens", v.scores.size(), v.tokens.size()));
  constexpr std::string_view kPrefix = "tokenizer.ggml.add_space_prefix";
  bool prefix = true;  // llama.cpp's default for this model
  try {
    prefix = f.get_bool_or(std::string(kPrefix), true);
  } catch (const Error& e) {
    bad_key(kPrefix, e.what());
  }
  if (prefix) bad_key(kPrefix, "true (or absent) is not supported: only SentencePiece vocabularies without a space prefix");
  // Gemma's scores do not follow its merge order; its token order does.
  v.spm_rank_by_id = f.get_string_or("general.architecture", "").starts_with("gemma");
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const gguf::File& f) {
  constexpr std::string_view kModel = "tokenizer.ggml.model";
  constexpr std::string_view kPre = "tokenizer.ggml.pre";
  constexpr std::string_view kTokens = "tokenizer.ggml.tokens";
  constexpr std::string_view kTypes = "tokenizer.ggml.token_type";
  constexpr std::string_view kMerges = "tokenizer.ggml.merges";

  std::string model;
  try {
    model = f.get_string(kModel);
  } catch (const Error& e) {
    bad_key(kModel, e.what());
  }
  if (model != "gpt2" && model != "llama")
    bad_key(kModel, fmt::format("tokenizer model '{}' is not supported (gpt2, llama)", gguf::printable(model)));

  Vocab v;
  v.model = model;
  try {
    v.pre = f.get_string_or(std::string(kPre), "default");
  } catch (const Error& e) {
    bad_key(kPre, e.what());
  }
  if (v.pre != "smollm" && v.pre != "gpt2" && v.pre != "default")
    bad_key(kPre, fmt::format("pre-tokenizer '{}' is not supported (smollm, gpt2)", v.pre));

  v.tokens = string_array(f, kTokens);
  if (v.tokens.empty()) bad_key(kTokens, "empty vocabulary");
  if (f.find(kTypes) != nullptr) {
    try {
      const auto& arr = f.get_array(kTypes);
      v.token_types.reserve(arr.size());
      for (const auto& t : arr) v.token_types.push_back(static_cast<int32_t>(t.as_i64()));
    } catch (const Error& e) {
      bad_key(kTypes, e.what());
    }
    if (v.token_types.size() != v.tokens.size())
      bad_key(kTypes, fmt::format("{} types for {} tokens", v.token_types.size(), v.tokens.size()));
  }
  if (model == "gpt2") v.merges = string_array(f, kMerges);
  if (model == "llama") read_sentencepiece(f, v);

  v.bos_id = optional_id(f, "tokenizer.ggml.bos_token_id", v.tokens.size());
  v.eos_id = optional_id(f, "tokenizer.ggml.eos_token_id", v.tokens.size());
  v.unk_id = optional_id(f, "tokenizer.ggml.unknown_token_id", v.tokens.size());
  try {
    v.add_bos = f.get_bool_or("tokenizer.ggml.add_bos_token", false);
  } catch (const Error& e) {
    bad_key("tokenizer.ggml.add_bos_token", e.what());
  }
  try {
    v.chat_template = f.get_string_or("tokenizer.chat_template", "");
  } catch (const Error& e) {
    bad_key("tokenizer.chat_template", e.what());
  }

  try {
    return Tokenizer(std::move(v));
  } catch (const InvalidArgument& e) {
    // Only merges can still be wrong here: everything else was checked above.
    bad_key(kMerges, e.what());
  }
}

}  // namespace activekv
