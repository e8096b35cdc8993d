// Bounds-checked cursor used by every parser in this folder.
#include "reader.h"

#include <bit>

namespace activekv::gguf::detail {

static_assert(std::endian::native == std::endian::little,
              "GGUF reader assumes a little-endian host (GGUF files are little endian)");

std::string FieldRef::str() const {
  std::string s(base);
  if (index != kNoIndex) {
    // Appended piecewise: "[" + to_string(...) trips a GCC 12 -Wrestrict false positive.
    s += '[';
    s += std::to_string(index);
    s += ']';
  }
  return s;
}

void Reader::need(uint64_t n, const FieldRef& field) const {
  if (n > remaining()) {
    fail(field, pos_,
         "truncated: need " + std::to_string(n) + " bytes but only " +
             std::to_string(remaining()) + " remain of file size " + std::to_string(size_));
  }
}

void Reader::fail(const FieldRef& field, uint64_t at, const std::string& problem) const {
  throw FormatError(field.str(), at, problem);
}

std::string Reader::string(const FieldRef& field) {
  const uint64_t at = pos_;
  const uint64_t len = u64(field);
  // Checked before constructing the string so a bogus length cannot allocate.
  if (len > remaining()) {
    fail(field, at,
         "string length " + std::to_string(len) + " exceeds the " +
             std::to_string(remaining()) + " bytes remaining");
  }
  std::string s(reinterpret_cast<const char*>(data_ + pos_), len);
  pos_ += len;
  return s;
}

void Reader::seek(uint64_t new_pos, const FieldRef& field) {
  if (new_pos > size_) {
    fail(field, pos_,
         "offset " + std::to_string(new_pos) + " is past the end of the file (size " +
             std::to_string(size_) + ")");
  }
  pos_ = new_pos;
}

std::string quoted(std::string_view name) {
  constexpr size_t kMax = 80;
  std::string s = "'";
  for (size_t i = 0; i < name.size() && i < kMax; ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'') {
      s += static_cast<char>(c);
    } else {
      append_hex_escape(s, c);
    }
  }
  if (name.size() > kMax) s += "...";
  return s + "'";
}

void append_hex_escape(std::string& out, unsigned char c) {
  static const char* hex = "0123456789abcdef";
  out += "\\x";
  out += hex[c >> 4];
  out += hex[c & 15];
}

}  // namespace activekv::gguf::detail
