// ChatML rendering and the default system message of a chat template.
//
// We do not run jinja. SmolLM2's template is ChatML whose only non-trivial
// part is "if the first message is not a system message, insert
// '<|im_start|>system\n<default><|im_end|>\n'"; the default is read from the
// string literal in tokenizer.chat_template.
#include <fmt/format.h>

#include "internal.h"

namespace activekv {

namespace tok {

namespace {

// Undoes the escapes of a jinja (Python-like) string literal body.
std::string unescape_literal(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out.push_back(s[i]);
      continue;
    }
    const char c = s[++i];
    switch (c) {
      case 'n': out.push_back('\n'); break;
      case 't': out.push_back('\t'); break;
      case 'r': out.push_back('\r'); break;
      default: out.push_back(c); break;  // \\ \' \" and anything else
    }
  }
  return out;
}

// True if `s` holds `quote` not preceded by a backslash escape.
bool has_unescaped(std::string_view s, char quote) {
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\') ++i;
    else if (s[i] == quote) return true;
  }
  return false;
}

}  // namespace

std::string find_default_system_message(std::string_view tmpl) {
  constexpr std::string_view kStart = "<|im_start|>system";
  constexpr std::string_view kEnd = "<|im_end|>";
  for (size_t pos = tmpl.find(kStart); pos != std::string_view::npos;
       pos = tmpl.find(kStart, pos + 1)) {
    // Must sit inside a string literal: find the quote that opens it.
    const size_t q = tmpl.find_last_of("'\"", pos);
    if (q == std::string_view::npos) continue;
    const char quote = tmpl[q];
    size_t body = pos + kStart.size();
    // The newline after the role, raw or escaped.
    if (tmpl.substr(body, 1) == "\n") body += 1;
    else if (tmpl.substr(body, 2) == "\\n") body += 2;
    else continue;
    const size_t end = tmpl.find(kEnd, body);
    if (end == std::string_view::npos) continue;
    const std::string_view raw = tmpl.substr(body, end - body);
    // A literal default only: no closing quote or jinja expression inside.
    if (has_unescaped(raw, quote) || raw.find("{{") != std::string_view::npos ||
        raw.find("{%") != std::string_view::npos || raw.empty())
      continue;
    return unescape_literal(raw);
  }
  return {};
}

std::string render_chatml(std::span<const ChatMessage> msgs, bool add_generation_prompt,
                          std::string_view default_system) {
  std::string out;
  if (!msgs.empty() && msgs.front().role != "system" && !default_system.empty())
    out += fmt::format("<|im_start|>system\n{}<|im_end|>\n", default_system);
  for (const ChatMessage& m : msgs)
    out += fmt::format("<|im_start|>{}\n{}<|im_end|>\n", m.role, m.content);
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

namespace {

// Jinja's `trim`: strips leading and trailing whitespace.
std::string_view trim(std::string_view s) {
  constexpr std::string_view kWs = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(kWs);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(kWs) - b + 1);
}

}  // namespace

std::string render_gemma(std::span<const ChatMessage> msgs, bool add_generation_prompt) {
  std::string out, first_user_prefix;
  if (!msgs.empty() && msgs.front().role == "system") {
    first_user_prefix = msgs.front().content + "\n\n";  // not trimmed, as in the template
    msgs = msgs.subspan(1);
  }
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string_view role = msgs[i].role == "assistant" ? "model" : std::string_view(msgs[i].role);
    out += fmt::format("<start_of_turn>{}\n{}{}<end_of_turn>\n", role, i == 0 ? first_user_prefix : "",
                       trim(msgs[i].content));
  }
  if (add_generation_prompt) out += "<start_of_turn>model\n";
  return out;
}

}  // namespace tok

}  // namespace activekv
