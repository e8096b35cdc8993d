// See openai_request.h.
#include "openai_request.h"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "api_error.h"

namespace activekv::serve {
namespace {

using nlohmann::json;

// The field `name` of `o` if present and not null.
const json* field(const json& o, const char* name) {
  auto it = o.find(name);
  return it == o.end() || it->is_null() ? nullptr : &*it;
}

[[noreturn]] void wrong_type(const char* name, const char* want) {
  throw ApiError::bad_request(fmt::format("'{}' must be {}", name, want), name);
}

double number(const json& v, const char* name, double lo, double hi) {
  if (!v.is_number()) wrong_type(name, "a number");
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) throw ApiError::bad_request(fmt::format("'{}' must be in [{}, {}], got {}", name, lo, hi, x), name);
  return x;
}

int64_t integer(const json& v, const char* name) {
  if (v.is_number_integer()) return v.get<int64_t>();  // unsigned values past int64 wrap: then checked as negative
  if (v.is_number_float()) {  // 16.0 is an integer; 16.5 is not
    const double x = v.get<double>();
    if (std::trunc(x) == x && std::fabs(x) < 9.0e18) return int64_t(x);
  }
  wrong_type(name, "an integer");
}

std::string text_content(const json& content) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) wrong_type("content", "a string or an array of text parts");
  std::string text;
  for (const json& part : content) {  // [{"type": "text", "text": "..."}]
    const json* t = part.is_object() ? field(part, "text") : nullptr;
    if (!t || !t->is_string() || part.value("type", "text") != "text")
      throw ApiError::bad_request("only text content parts are supported", "messages");
    text += t->get<std::string>();
  }
  return text;
}

std::vector<ChatMessage> parse_messages(const json& body) {
  const json* m = field(body, "messages");
  if (!m) throw ApiError::bad_request("'messages' is required", "messages");
  if (!m->is_array() || m->empty()) wrong_type("messages", "a non-empty array");
  std::vector<ChatMessage> out;
  for (const json& msg : *m) {
    if (!msg.is_object()) wrong_type("messages", "an array of objects");
    const json* role = field(msg, "role");
    if (!role || !role->is_string()) throw ApiError::bad_request("each message needs a string 'role'", "messages");
    const std::string r = role->get<std::string>();
    if (r != "system" && r != "user" && r != "assistant" && r != "developer")
      throw ApiError::bad_request(fmt::format("unknown message role '{}'", r), "messages");
    const json* content = field(msg, "content");
    out.push_back({r == "developer" ? "system" : r, content ? text_content(*content) : std::string()});
  }
  return out;
}

void parse_prompt(const json& body, CompletionRequest& r) {
  const json* p = field(body, "prompt");
  if (!p) throw ApiError::bad_request("'prompt' is required", "prompt");
  if (p->is_string()) {
    r.prompt = p->get<std::string>();
    return;
  }
  if (!p->is_array()) wrong_type("prompt", "a string, an array of one string, or an array of token ids");
  if (p->size() == 1 && (*p)[0].is_string()) {
    r.prompt = (*p)[0].get<std::string>();
    return;
  }
  for (const json& id : *p) {
    if (!id.is_number_integer()) throw ApiError::bad_request("'prompt' as an array holds one string or token ids only", "prompt");
    const int64_t v = id.get<int64_t>();
    if (v < 0 || v > INT32_MAX) throw ApiError::bad_request(fmt::format("token id {} is out of range", v), "prompt");
    r.prompt_ids.push_back(int32_t(v));
  }
}

std::vector<std::string> parse_stop(const json& v) {
  if (v.is_string()) return {v.get<std::string>()};
  if (!v.is_array() || v.size() > 4) wrong_type("stop", "a string or an array of at most 4 strings");
  std::vector<std::string> out;
  for (const json& s : v) {
    if (!s.is_string()) wrong_type("stop", "a string or an array of at most 4 strings");
    out.push_back(s.get<std::string>());
  }
  return out;
}

void parse_sampling(const json& body, CompletionRequest& r) {
  model::SamplerParams& s = r.sampling;
  s.temperature = 1.0f;  // OpenAI's defaults
  s.top_p = 1.0f;
  s.top_k = 0;
  if (const json* v = field(body, "temperature")) s.temperature = float(number(*v, "temperature", 0.0, 2.0));
  if (const json* v = field(body, "top_p")) {
    s.top_p = float(number(*v, "top_p", 0.0, 1.0));
    if (s.top_p <= 0.0f) throw ApiError::bad_request("'top_p' must be in (0, 1]", "top_p");
  }
  if (const json* v = field(body, "top_k")) {
    const int64_t k = integer(*v, "top_k");  // <= 0 (vLLM's -1 included): no limit
    s.top_k = int(std::clamp<int64_t>(k, -1, INT32_MAX));
  }
  if (const json* v = field(body, "seed")) {
    s.seed = uint64_t(integer(*v, "seed"));
    r.seed_given = true;
  }
}

}  // namespace

std::string json_error_message(const std::string& body, size_t byte) {
  const std::string what = "the request body is not valid JSON: ";
  if (body.find_first_not_of(" \t\r\n") == std::string::npos)
    return "the request body is empty; it must be a JSON object";
  // nlohmann's byte is 1-based, the position of the last byte it read; past
  // the end when the body stopped inside a value.
  if (byte == 0 || byte > body.size())
    return what + fmt::format("it ends inside a value after {} bytes (an unclosed object, array or string?)", body.size());
  const auto c = static_cast<unsigned char>(body[byte - 1]);
  if (c < 0x20 || c == 0x7F)
    return what + fmt::format("syntax error at byte {} (a control character, 0x{:02X}: escape it inside strings)", byte, c);
  if (c >= 0x80)
    return what + fmt::format("syntax error at byte {} (byte 0x{:02X}: invalid UTF-8, or text outside a string)", byte, c);
  return what + fmt::format("syntax error at byte {} (unexpected '{}')", byte, char(c));
}

CompletionRequest parse_completion_request(const std::string& body_text, bool chat) {
  json body;
  try {
    body = json::parse(body_text);
  } catch (const json::parse_error& e) {
    throw ApiError::bad_request(json_error_message(body_text, e.byte));
  } catch (const json::out_of_range&) {  // a number past double's range (1e999): parsed, not representable
    throw ApiError::bad_request("the request body holds a number too large to represent (past 1.8e308)");
  }
  if (!body.is_object()) throw ApiError::bad_request("the body must be a JSON object");
  CompletionRequest r;
  r.chat = chat;
  if (const json* m = field(body, "model")) {
    if (!m->is_string()) wrong_type("model", "a string");
    r.model = m->get<std::string>();
  }
  if (chat) {
    r.messages = parse_messages(body);
  } else {
    parse_prompt(body, r);
  }
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    if (const json* v = field(body, name)) {
      const int64_t n = integer(*v, name);
      if (n < 1) throw ApiError::bad_request(fmt::format("'{}' must be at least 1, got {}", name, n), name);
      r.max_tokens = n;
    }
  }
  if (const json* v = field(body, "n"); v && integer(*v, "n") != 1)
    throw ApiError::bad_request("only n = 1 is supported", "n");
  parse_sampling(body, r);
  if (const json* v = field(body, "stop")) r.stop = parse_stop(*v);
  if (const json* v = field(body, "stream")) {
    if (!v->is_boolean()) wrong_type("stream", "a boolean");
    r.stream = v->get<bool>();
  }
  if (const json* v = field(body, "stream_options")) {
    if (!v->is_object()) wrong_type("stream_options", "an object");
    if (const json* u = field(*v, "include_usage")) {
      if (!u->is_boolean()) wrong_type("stream_options.include_usage", "a boolean");
      r.include_usage = u->get<bool>();
    }
  }
  return r;
}

}  // namespace activekv::serve
