// Tokenizers from a GGUF vocabulary: byte-level BPE (GPT-2 / llama.cpp "gpt2"
// vocabularies, with the SmolLM pre-tokenizer) and SentencePiece-style BPE
// (llama.cpp "llama" vocabularies with scores, e.g. Gemma 3); ChatML or
// Gemma's turn format as the chat template.
//
// "llama" (SentencePiece) encoding: step 1 below (a user-defined token that is
// a run of spaces is not special here but a vocabulary entry spelled with
// U+2581), then each other fragment has its spaces replaced by U+2581 and is
// merged by token score -- by token order for Gemma (general.architecture
// gemma*), as transformers rebuilds Gemma's merges (src/tokenizer/spm.cpp);
// characters outside the vocabulary become their bytes' <0xNN> tokens. No space prefix is added (tokenizer.ggml.add_space_prefix must be
// false). Decoding maps U+2581 back to ' ' and <0xNN> to the byte. This
// matches Hugging Face `tokenizers` as transformers builds it from the GGUF
// (tests/golden/gemma3_tokens.json is the check).
//
// "gpt2" encoding:
// Encoding, in order:
//   1. if parse_special, the text is split on special tokens (token type
//      CONTROL or USER_DEFINED), longest match first; each maps to its id;
//   2. every other fragment is pre-tokenized: for "smollm" each \p{N} code point
//      is split off on its own, then the GPT-2 regex
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      is applied (implemented by hand over code points; ICU gives categories);
//   3. each word's bytes go through the GPT-2 byte-to-unicode table;
//   4. merges are applied by rank, lowest first (leftmost on ties).
// This matches Hugging Face `tokenizers` configured as SmolLM2's tokenizer.json
// (tests/golden/smollm2_tokens.json is the check).
//
// A Tokenizer is immutable after construction; copies share their tables and
// every const method may be called from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "activekv/core/error.h"

namespace activekv {

namespace gguf {
class File;
}

/// One message of a conversation, for Tokenizer::apply_chat_template.
struct ChatMessage {
  std::string role;     ///< "system", "user" or "assistant"
  std::string content;
};

/// GGUF token types (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
  UNDEFINED = 0, NORMAL = 1, UNKNOWN = 2, CONTROL = 3, USER_DEFINED = 4, UNUSED = 5, BYTE = 6,
};

class Tokenizer {
 public:
  /// Everything a tokenizer is built from, as plain data (what a GGUF's
  /// tokenizer.* keys hold).
  struct Vocab {
    std::vector<std::string> tokens;       ///< token text, byte-level encoded; index = id
    std::vector<int32_t> token_types;      ///< TokenType per token; empty = all NORMAL
    std::vector<std::string> merges;       ///< "left right", rank = index ("gpt2")
    std::string model = "gpt2";            ///< tokenizer.ggml.model: "gpt2" or "llama" (SentencePiece)
    std::vector<float> scores;             ///< tokenizer.ggml.scores ("llama": merge priority)
    bool spm_rank_by_id = false;           ///< "llama": merge by token order, not score (Gemma)
    int32_t bos_id = -1;                   ///< -1 = none
    int32_t eos_id = -1;
    int32_t unk_id = -1;                   ///< emitted for a byte with no token; -1 = throw
    bool add_bos = false;                  ///< tokenizer.ggml.add_bos_token
    std::string pre = "smollm";            ///< pre-tokenizer: "smollm" or "gpt2"
    std::string chat_template;             ///< tokenizer.chat_template (may be empty)
  };

  /// Builds the tables. Throws InvalidArgument if the vocabulary is empty,
  /// sizes disagree (scores for "llama"), an id is out of range, a merge is
  /// malformed or names an unknown token, or the model or pre-tokenizer is
  /// not supported.
  explicit Tokenizer(Vocab vocab);

  /// Reads tokenizer.ggml.{model,pre,tokens,token_type,merges,scores,
  /// bos_token_id,eos_token_id,unknown_token_id,add_bos_token,
  /// add_space_prefix} and tokenizer.chat_template. Models "gpt2" and
  /// "llama" (SentencePiece; add_space_prefix true is not supported) are.
  /// Throws Error naming the bad key.
  static Tokenizer from_gguf(const gguf::File& f);

  /// Token ids of `text` (arbitrary bytes; invalid UTF-8 is kept byte for byte).
  /// add_bos prepends bos_id() (if the vocabulary has one). With
  /// parse_special=false special-token text is tokenized as ordinary text.
  std::vector<int32_t> encode(std::string_view text, bool add_bos,
                              bool parse_special = true) const;

  /// The bytes the ids stand for; special tokens are rendered as their text.
  /// Throws Error naming the first out-of-range id.
  std::string decode(std::span<const int32_t> ids) const;

  /// Raw bytes of one token (possibly an incomplete UTF-8 sequence), for
  /// streaming output. Throws Error if the id is out of range.
  std::string token_to_piece(int32_t id) const;

  int32_t bos_id() const;
  int32_t eos_id() const;
  /// True for eos and for the control tokens that end a turn
  /// (<|im_end|>, <|endoftext|>, <|eot_id|>, <end_of_turn> when present).
  bool is_end_of_generation(int32_t id) const;
  size_t vocab_size() const;
  bool add_bos_default() const;
  /// Id of a token by its exact text, or -1.
  int32_t token_id(std::string_view text) const;

  /// Gemma (the vocabulary has <start_of_turn>): per message
  /// "<start_of_turn>{role}\n{content}<end_of_turn>\n" with role "assistant"
  /// written "model" and the content trimmed; a leading system message is not
  /// a turn but prefixes the first turn's content with "{system}\n\n"; then
  /// "<start_of_turn>model\n" if add_generation_prompt. The template's BOS is
  /// not written: encode(..., add_bos) adds it.
  /// Otherwise ChatML: "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then
  /// "<|im_start|>assistant\n" if add_generation_prompt. If the conversation is
  /// non-empty and its first message is not a system message, the default
  /// system message found in the model's chat template (a literal
  /// "<|im_start|>system\n...<|im_end|>" in tokenizer.chat_template) is
  /// prepended; without one, nothing is.
  std::string apply_chat_template(std::span<const ChatMessage> msgs,
                                  bool add_generation_prompt) const;

  /// The default system message taken from the chat template ("" if none).
  const std::string& default_system_message() const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace activekv
