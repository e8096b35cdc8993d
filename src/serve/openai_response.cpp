// See openai_response.h.
#include "openai_response.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <random>

#include "api_error.h"

namespace activekv::serve {

using nlohmann::json;

ResponseHead new_head(bool chat, const std::string& model) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();  // ids differ across server runs
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return {chat, fmt::format("{}-{:08x}{:08x}", chat ? "chatcmpl" : "cmpl", uint32_t(salt), uint32_t(++counter)),
          std::chrono::duration_cast<std::chrono::seconds>(now).count(), model};
}

json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

namespace {

json envelope(const ResponseHead& h, bool chunk) {
  const char* object = h.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return {{"id", h.id}, {"object", object}, {"created", h.created}, {"model", h.model}};
}

json reason_or_null(const std::string& r) { return r.empty() ? json(nullptr) : json(r); }

}  // namespace

json completion_json(const ResponseHead& h, const std::string& text, const std::string& finish_reason,
                     int64_t prompt_tokens, int64_t completion_tokens) {
  json j = envelope(h, false);
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", reason_or_null(finish_reason)}};
  if (h.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  j["choices"] = json::array({choice});
  j["usage"] = usage_json(prompt_tokens, completion_tokens);
  return j;
}

json chunk_json(const ResponseHead& h, const std::string& text, const std::string& finish_reason, bool role_only) {
  json j = envelope(h, true);
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", reason_or_null(finish_reason)}};
  if (h.chat) {
    if (role_only) {
      choice["delta"] = {{"role", "assistant"}, {"content", ""}};
    } else if (!text.empty() || finish_reason.empty()) {
      choice["delta"] = {{"content", text}};
    } else {
      choice["delta"] = json::object();
    }
  } else {
    choice["text"] = text;
  }
  j["choices"] = json::array({choice});
  return j;
}

json usage_chunk_json(const ResponseHead& h, int64_t prompt_tokens, int64_t completion_tokens) {
  json j = envelope(h, true);
  j["choices"] = json::array();
  j["usage"] = usage_json(prompt_tokens, completion_tokens);
  return j;
}

json models_json(const std::string& model, int64_t created, int64_t max_model_len) {
  return {{"object", "list"},
          {"data", json::array({{{"id", model},
                                 {"object", "model"},
                                 {"created", created},
                                 {"owned_by", "activekv"},
                                 {"max_model_len", max_model_len}}})}};
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

std::string error_body(const ApiError& e) {
  auto or_null = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
  return dump({{"error", {{"message", e.what()}, {"type", e.type}, {"param", or_null(e.param)}, {"code", or_null(e.code)}}}});
}

std::string error_body(int status, const std::string& message) {
  const char* type = status == 401   ? "authentication_error"
                     : status == 404 ? "not_found_error"
                     : status == 413 ? "invalid_request_error"
                     : status == 429 ? "rate_limit_error"
                     : status == 503 ? "service_unavailable"
                     : status < 500  ? "invalid_request_error"
                                     : "internal_server_error";
  return error_body(ApiError(status, message, type));
}

}  // namespace activekv::serve
