// OpenAI response bodies: completions and chat completions, whole or as
// stream chunks, usage, the model list. Every dump replaces invalid UTF-8
// (a completion cut inside a character) with U+FFFD instead of throwing.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace activekv::serve {

/// Identifies one response: the same id and created time in all its chunks.
struct ResponseHead {
  bool chat = false;
  std::string id;     ///< "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;  ///< Unix seconds
  std::string model;
};

/// A new head with a fresh id and the current time.
ResponseHead new_head(bool chat, const std::string& model);
nlohmann::json usage_json(int64_t prompt_tokens, int64_t completion_tokens);
/// The whole (non-streamed) response.
nlohmann::json completion_json(const ResponseHead& h, const std::string& text, const std::string& finish_reason,
                               int64_t prompt_tokens, int64_t completion_tokens);
/// One stream chunk: `text` as the delta; with `finish_reason` non-empty, the
/// last chunk (chat: an empty delta); `role_only` (chat) the first chunk, the
/// assistant role with empty content.
nlohmann::json chunk_json(const ResponseHead& h, const std::string& text, const std::string& finish_reason,
                          bool role_only = false);
/// The usage chunk of stream_options.include_usage: no choices, the usage.
nlohmann::json usage_chunk_json(const ResponseHead& h, int64_t prompt_tokens, int64_t completion_tokens);
/// GET /v1/models.
nlohmann::json models_json(const std::string& model, int64_t created, int64_t max_model_len);

/// JSON text, invalid UTF-8 replaced.
std::string dump(const nlohmann::json& j);
/// One server-sent event: "data: <json>\n\n".
std::string sse(const nlohmann::json& j);

}  // namespace activekv::serve
