// Internal pieces of the tokenizer (not part of the public API).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "activekv/tokenizer/tokenizer.h"

namespace activekv::tok {

// ---- unicode.cpp: UTF-8 decoding and character classes -------------------

/// Character class used by the pre-tokenizer regex.
enum class CharClass : uint8_t { Letter, Number, Space, Other };

/// One code point of the input: its bytes [begin, begin+len) and class.
/// A byte that does not start a valid UTF-8 sequence is one "code point" of
/// class Other, so every input byte is covered exactly once.
struct CodePoint {
  uint32_t begin;
  uint8_t len;
  CharClass cls;
  uint32_t cp;  ///< the code point, or 0xFFFFFFFF for an invalid byte
};

/// Decodes `s` into code points (appends to `out`, which is cleared first).
void decode_utf8(std::string_view s, std::vector<CodePoint>& out);
/// Class of a code point: \p{L} → Letter, \p{N} → Number, White_Space → Space.
CharClass classify(uint32_t cp);
/// Appends the UTF-8 encoding of `cp` to `out`.
void append_utf8(std::string& out, uint32_t cp);

// ---- pretokenize.cpp: the hand-written regex split -------------------------

enum class PreTokenizer { Gpt2, SmolLM };

/// Splits `text` into words (as [begin, end) byte ranges into text), calling
/// out.push_back for each. `scratch` is reused storage.
void pretokenize(std::string_view text, PreTokenizer kind,
                 std::vector<CodePoint>& scratch,
                 std::vector<std::pair<uint32_t, uint32_t>>& out);

// ---- byte_level.cpp: GPT-2 bytes <-> unicode --------------------------------

/// The code point GPT-2 maps byte b to.
uint32_t byte_to_unicode(uint8_t b);
/// Inverse: byte for a code point of the table, or -1.
int unicode_to_byte(uint32_t cp);
/// Byte-level text (e.g. "Ġhello") back to raw bytes. Code points outside
/// the table are kept as their UTF-8.
std::string byte_level_decode(std::string_view s);
/// Raw bytes to byte-level text.
std::string byte_level_encode(std::string_view bytes);

// ---- bpe.cpp: merges by rank ------------------------------------------------

class Bpe {
 public:
  /// tokens: byte-level token texts. merges: "left right" by rank.
  /// Throws InvalidArgument on a malformed merge or one naming an unknown token.
  Bpe(const std::vector<std::string>& tokens, const std::vector<std::string>& merges,
      int32_t unk_id);
  /// Appends the ids of one pre-tokenized word (raw bytes) to `out`.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t id;
  };
  static uint64_t key(int32_t a, int32_t b) {
    return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
  }
  const Merge* find(int32_t a, int32_t b) const {
    auto it = merges_.find(key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  }
  std::array<int32_t, 256> byte_id_{};  ///< token of each single byte, or -1
  std::unordered_map<uint64_t, Merge> merges_;
  int32_t unk_id_;
};

// ---- spm.cpp: SentencePiece-style merges by score ---------------------------

/// Hash of string_view keys without copies (heterogeneous lookup).
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

class Spm {
 public:
  /// tokens/scores/types: the GGUF vocabulary (sizes checked by the caller,
  /// scores here). Throws InvalidArgument if scores and tokens differ in size.
  /// rank_by_id: merge priority is the merged token's id (lower first)
  /// instead of its score (Gemma; see spm.cpp).
  Spm(const std::vector<std::string>& tokens, const std::vector<float>& scores,
      const std::vector<int32_t>& types, int32_t unk_id, bool rank_by_id);
  /// Appends the ids of one text fragment (no special tokens in it) to `out`.
  /// Throws Error for a byte with neither a <0xNN> token nor an unknown token.
  void encode_fragment(std::string_view text, std::vector<int32_t>& out) const;
  /// The bytes a token stands for: U+2581 -> ' ', <0xNN> -> the byte.
  static std::string piece(std::string_view token, TokenType type);
  /// Whitespace only, with at least one space ("  "): such a token is a
  /// vocabulary entry spelled with U+2581, never a special token (as
  /// transformers' Gemma converter has it).
  static bool is_space_run(std::string_view token);

 private:
  static std::string normalise(std::string_view text);  ///< ' ' -> U+2581
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> ids_;
  std::vector<float> priority_;  // per token: merge priority, higher first
  std::array<int32_t, 256> byte_id_{};
  int32_t unk_id_;
};

// ---- chat_template.cpp -----------------------------------------------------

/// The default system message written literally in a ChatML jinja template
/// ("<|im_start|>system\n" ... "<|im_end|>" inside a string literal), or "".
std::string find_default_system_message(std::string_view chat_template);
/// ChatML rendering (see Tokenizer::apply_chat_template).
std::string render_chatml(std::span<const ChatMessage> msgs, bool add_generation_prompt,
                          std::string_view default_system);
/// Gemma's turn format (see Tokenizer::apply_chat_template).
std::string render_gemma(std::span<const ChatMessage> msgs, bool add_generation_prompt);

}  // namespace activekv::tok
