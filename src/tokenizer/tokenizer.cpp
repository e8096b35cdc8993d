// Tokenizer core: tables, special-token split, encode and decode.
#include <algorithm>
#include <optional>
#include <unordered_map>

#include <fmt/format.h>

#include "internal.h"

namespace activekv {

struct Tokenizer::Impl {
  std::vector<std::string> tokens;   // byte-level text
  std::vector<int32_t> types;
  std::vector<std::string> pieces;   // decoded bytes per token
  std::unordered_map<std::string, int32_t> by_text;
  std::optional<tok::Bpe> bpe;  // model "gpt2"
  std::optional<tok::Spm> spm;  // model "llama"
  tok::PreTokenizer pre;
  bool gemma_chat = false;
  int32_t bos = -1, eos = -1;
  bool add_bos = false;
  std::vector<int32_t> end_of_generation;   // sorted
  // Special tokens whose text starts with byte b, longest first.
  std::array<std::vector<int32_t>, 256> special_by_first;
  bool has_specials = false;
  std::string chat_template;
  std::string default_system;

  Impl(Vocab& v, tok::PreTokenizer p) : tokens(std::move(v.tokens)), types(std::move(v.token_types)), pre(p) {
    if (v.model == "llama") {
      spm.emplace(tokens, v.scores, types, v.unk_id, v.spm_rank_by_id);
    } else {
      bpe.emplace(tokens, v.merges, v.unk_id);
    }
  }

  void encode_text(std::string_view text, std::vector<int32_t>& out) const;
};

namespace {

bool is_special_type(int32_t t) {
  return t == static_cast<int32_t>(TokenType::CONTROL) ||
         t == static_cast<int32_t>(TokenType::USER_DEFINED);
}

tok::PreTokenizer parse_pre(const std::string& name) {
  if (name == "smollm") return tok::PreTokenizer::SmolLM;
  if (name == "gpt2" || name == "default") return tok::PreTokenizer::Gpt2;
  throw InvalidArgument(fmt::format(
      "tokenizer: pre-tokenizer '{}' is not supported (supported: smollm, gpt2)", name));
}

}  // namespace

Tokenizer::Tokenizer(Vocab v) {
  const size_t n = v.tokens.size();
  if (n == 0) throw InvalidArgument("tokenizer: empty vocabulary");
  if (n > static_cast<size_t>(INT32_MAX))
    throw InvalidArgument("tokenizer: vocabulary too large");
  if (v.token_types.empty()) v.token_types.assign(n, static_cast<int32_t>(TokenType::NORMAL));
  if (v.token_types.size() != n)
    throw InvalidArgument(fmt::format("tokenizer: {} token types for {} tokens",
                                      v.token_types.size(), n));
  auto check_id = [&](int32_t id, const char* what) {
    if (id < -1 || id >= static_cast<int32_t>(n))
      throw InvalidArgument(
          fmt::format("tokenizer: {} id {} is out of range [0, {})", what, id, n));
  };
  check_id(v.bos_id, "bos");
  check_id(v.eos_id, "eos");
  check_id(v.unk_id, "unknown token");

  if (v.model != "gpt2" && v.model != "llama")
    throw InvalidArgument(fmt::format("tokenizer: model '{}' is not supported (gpt2, llama)", v.model));
  const bool sentencepiece = v.model == "llama";
  const tok::PreTokenizer pre = sentencepiece ? tok::PreTokenizer::Gpt2 : parse_pre(v.pre);  // unused by llama
  const int32_t bos = v.bos_id, eos = v.eos_id;
  const bool add_bos = v.add_bos;
  std::string tmpl = std::move(v.chat_template);

  auto impl = std::make_shared<Impl>(v, pre);
  impl->bos = bos;
  impl->eos = eos;
  impl->add_bos = add_bos;
  impl->chat_template = std::move(tmpl);
  impl->default_system = tok::find_default_system_message(impl->chat_template);

  impl->pieces.resize(n);
  impl->by_text.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    const std::string& t = impl->tokens[i];
    const int32_t type = impl->types[i];
    const auto id = static_cast<int32_t>(i);
    impl->by_text.emplace(t, id);
    if (is_special_type(type) && !(sentencepiece && tok::Spm::is_space_run(t))) {
      impl->pieces[i] = t;  // rendered as its text
      if (!t.empty()) {
        impl->special_by_first[static_cast<unsigned char>(t[0])].push_back(id);
        impl->has_specials = true;
      }
    } else if (sentencepiece) {
      impl->pieces[i] = tok::Spm::piece(t, static_cast<TokenType>(type));
    } else {
      impl->pieces[i] = tok::byte_level_decode(t);
    }
  }
  for (auto& list : impl->special_by_first) {
    std::stable_sort(list.begin(), list.end(), [&](int32_t a, int32_t b) {
      return impl->tokens[a].size() > impl->tokens[b].size();
    });
  }

  if (eos >= 0) impl->end_of_generation.push_back(eos);
  for (const char* name : {"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>"}) {
    auto it = impl->by_text.find(name);
    if (it != impl->by_text.end() && is_special_type(impl->types[it->second]))
      impl->end_of_generation.push_back(it->second);
  }
  std::sort(impl->end_of_generation.begin(), impl->end_of_generation.end());
  impl->gemma_chat = impl->by_text.contains("<start_of_turn>");
  impl_ = std::move(impl);
}

void Tokenizer::Impl::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  if (spm) {
    spm->encode_fragment(text, out);
    return;
  }
  thread_local std::vector<tok::CodePoint> scratch;
  thread_local std::vector<std::pair<uint32_t, uint32_t>> words;
  words.clear();
  tok::pretokenize(text, pre, scratch, words);
  for (const auto& [b, e] : words) bpe->encode_word(text.substr(b, e - b), out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos,
                                       bool parse_special) const {
  const Impl& m = *impl_;
  // The pre-tokenizer keeps 32-bit byte offsets.
  if (text.size() > UINT32_MAX)
    throw InvalidArgument(fmt::format("tokenizer: text of {} bytes is too long to encode (max {})",
                                      text.size(), UINT32_MAX));
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && m.bos >= 0) out.push_back(m.bos);
  if (!parse_special || !m.has_specials) {
    m.encode_text(text, out);
    return out;
  }
  // Leftmost special token, longest first at each position.
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const auto& cands = m.special_by_first[static_cast<unsigned char>(text[i])];
    if (cands.empty()) continue;
    for (int32_t id : cands) {
      const std::string& s = m.tokens[id];
      if (text.compare(i, s.size(), s) == 0) {
        m.encode_text(text.substr(start, i - start), out);
        out.push_back(id);
        i += s.size();
        start = i;
        --i;  // the loop's ++i
        break;
      }
    }
  }
  m.encode_text(text.substr(start), out);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  const Impl& m = *impl_;
  std::string out;
  out.reserve(ids.size() * 4);
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= m.pieces.size())
      throw Error(fmt::format("tokenizer: cannot decode token id {} (vocabulary size {})", id,
                              m.pieces.size()));
    out += m.pieces[id];
  }
  return out;
}

std::string Tokenizer::token_to_piece(int32_t id) const {
  const Impl& m = *impl_;
  if (id < 0 || static_cast<size_t>(id) >= m.pieces.size())
    throw Error(fmt::format("tokenizer: token id {} is out of range (vocabulary size {})", id,
                            m.pieces.size()));
  return m.pieces[id];
}

int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::eos_id() const { return impl_->eos; }
size_t Tokenizer::vocab_size() const { return impl_->tokens.size(); }
bool Tokenizer::add_bos_default() const { return impl_->add_bos; }
const std::string& Tokenizer::default_system_message() const { return impl_->default_system; }

std::string Tokenizer::apply_chat_template(std::span<const ChatMessage> msgs,
                                           bool add_generation_prompt) const {
  if (impl_->gemma_chat) return tok::render_gemma(msgs, add_generation_prompt);
  return tok::render_chatml(msgs, add_generation_prompt, impl_->default_system);
}

bool Tokenizer::is_end_of_generation(int32_t id) const {
  const auto& v = impl_->end_of_generation;
  return std::binary_search(v.begin(), v.end(), id);
}

int32_t Tokenizer::token_id(std::string_view text) const {
  auto it = impl_->by_text.find(std::string(text));
  return it == impl_->by_text.end() ? -1 : it->second;
}

}  // namespace activekv
