// UTF-8 decoding and the character classes of the pre-tokenizer regex.
#include <unicode/uchar.h>

#include "internal.h"

namespace activekv::tok {

namespace {

// ASCII classes, to skip ICU for the common case.
constexpr std::array<CharClass, 128> make_ascii_table() {
  std::array<CharClass, 128> t{};
  for (int c = 0; c < 128; ++c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
      t[c] = CharClass::Letter;
    else if (c >= '0' && c <= '9')
      t[c] = CharClass::Number;
    else if (c == ' ' || (c >= 0x09 && c <= 0x0D))
      t[c] = CharClass::Space;
    else
      t[c] = CharClass::Other;
  }
  return t;
}
constexpr auto kAscii = make_ascii_table();

}  // namespace

CharClass classify(uint32_t cp) {
  if (cp < 128) return kAscii[cp];
  if (cp > 0x10FFFF) return CharClass::Other;
  const auto c = static_cast<UChar32>(cp);
  const uint32_t mask = U_GET_GC_MASK(c);
  if (mask & U_GC_L_MASK) return CharClass::Letter;
  if (mask & U_GC_N_MASK) return CharClass::Number;
  // \s in the Oniguruma/Rust regex engines = the White_Space property.
  if (u_isUWhiteSpace(c)) return CharClass::Space;
  return CharClass::Other;
}

void decode_utf8(std::string_view s, std::vector<CodePoint>& out) {
  out.clear();
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b0 = p[i];
    if (b0 < 0x80) {
      out.push_back({uint32_t(i), 1, kAscii[b0], b0});
      ++i;
      continue;
    }
    uint32_t cp = 0;
    size_t len = 0;
    uint32_t min = 0;
    if ((b0 & 0xE0) == 0xC0) {
      cp = b0 & 0x1F; len = 2; min = 0x80;
    } else if ((b0 & 0xF0) == 0xE0) {
      cp = b0 & 0x0F; len = 3; min = 0x800;
    } else if ((b0 & 0xF8) == 0xF0) {
      cp = b0 & 0x07; len = 4; min = 0x10000;
    }
    bool ok = len != 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) ok = false;
      else cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    // Reject overlong forms, surrogates and values past U+10FFFF.
    if (ok && (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))) ok = false;
    if (!ok) {
      out.push_back({uint32_t(i), 1, CharClass::Other, 0xFFFFFFFFu});
      ++i;
      continue;
    }
    out.push_back({uint32_t(i), uint8_t(len), classify(cp), cp});
    i += len;
  }
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

}  // namespace activekv::tok
