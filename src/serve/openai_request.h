// OpenAI request bodies -> what the server generates: POST /v1/completions
// and POST /v1/chat/completions. Only the fields below are read; others are
// ignored (as vLLM and llama-server do). Every field is type- and
// range-checked; a bad one throws ApiError 400 naming it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "activekv/model/sampler.h"
#include "activekv/tokenizer/tokenizer.h"

namespace activekv::serve {

struct CompletionRequest {
  bool chat = false;                       ///< /v1/chat/completions
  std::string model;                       ///< as given; empty: not given
  std::string prompt;                      ///< completions: the prompt text
  std::vector<int32_t> prompt_ids;         ///< completions: the prompt as token ids (instead of text)
  std::vector<ChatMessage> messages;       ///< chat: the conversation
  std::optional<int64_t> max_tokens;       ///< absent: completions 16, chat the rest of the context
  model::SamplerParams sampling;           ///< OpenAI's defaults: temperature 1, top_p 1, no top-k
  bool seed_given = false;                 ///< seed absent: a random one per request
  std::vector<std::string> stop;           ///< at most 4
  bool stream = false;
  bool include_usage = false;              ///< stream_options.include_usage
};

/// Parses a request body. Throws ApiError 400 for malformed JSON (invalid
/// UTF-8 included; the message from json_error_message), a number past
/// double's range, a body that is not an object, and any field of the wrong
/// type or out of range (the message and `param` name it).
CompletionRequest parse_completion_request(const std::string& body, bool chat);

/// What is wrong with a body the JSON parser refused, in one line for the
/// user: where (`byte`, 1-based, as nlohmann's parse_error::byte; past the
/// end: the body stopped inside a value) and the byte found there -- never
/// the parser's exception names or ids.
/// e.g. "the request body is not valid JSON: syntax error at byte 17 (unexpected '}')".
std::string json_error_message(const std::string& body, size_t byte);

}  // namespace activekv::serve
