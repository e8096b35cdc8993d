// Text read from a file we did not write (a GGUF's names, an eval JSON's
// model name), made safe for one line of a message or table.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>

namespace activekv {

/// At most ~`max_bytes` bytes of `s` (cut on a UTF-8 character boundary,
/// "..." after), newlines as "\n" and other control bytes as "\xNN", so that
/// a NUL cannot cut the line short nor an escape sequence reach the terminal.
inline std::string printable(std::string_view s, size_t max_bytes = 80) {
  size_t n = std::min(s.size(), max_bytes);
  while (n < s.size() && n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return n < s.size() ? out + "..." : out;
}

}  // namespace activekv
