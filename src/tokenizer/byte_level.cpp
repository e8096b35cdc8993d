// GPT-2's reversible byte <-> unicode map: printable bytes ('!'..'~',
// '¡'..'¬', '®'..'ÿ') map to themselves, the other 68 bytes to U+0100.. in
// byte order (so ' ' becomes 'Ġ' U+0120 and '\n' becomes 'Ċ' U+010A).
#include "internal.h"

namespace activekv::tok {

namespace {

struct Tables {
  std::array<uint32_t, 256> to_unicode{};
  std::array<int16_t, 512> to_byte{};  // every mapped code point is < 0x144
  Tables() {
    to_byte.fill(-1);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) ||
                             (b >= 0xAE && b <= 0xFF);
      to_unicode[b] = printable ? b : next++;
      to_byte[to_unicode[b]] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

uint32_t byte_to_unicode(uint8_t b) { return tables().to_unicode[b]; }

int unicode_to_byte(uint32_t cp) {
  return cp < tables().to_byte.size() ? tables().to_byte[cp] : -1;
}

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) append_utf8(out, byte_to_unicode(b));
  return out;
}

std::string byte_level_decode(std::string_view s) {
  std::vector<CodePoint> cps;
  decode_utf8(s, cps);
  std::string out;
  out.reserve(s.size());
  for (const CodePoint& c : cps) {
    const int b = c.cp == 0xFFFFFFFFu ? -1 : unicode_to_byte(c.cp);
    if (b >= 0)
      out.push_back(static_cast<char>(b));
    else
      out.append(s.substr(c.begin, c.len));  // not from the table: keep as is
  }
  return out;
}

}  // namespace activekv::tok
