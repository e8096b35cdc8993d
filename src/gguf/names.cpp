// The rules gguf.md sets for the names a file carries: metadata keys and
// tensor names. Both are compared and printed by the engine, never parsed.
#include <unicode/utf8.h>

#include "parse.h"

namespace activekv::gguf::detail {

namespace {

/// Index of the first byte of `s` that is not part of a well-formed UTF-8
/// sequence (overlong forms, surrogates and values past U+10FFFF included,
/// as ICU's U8_NEXT judges them), or npos if `s` is valid UTF-8.
size_t first_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const int64_t n = static_cast<int64_t>(s.size());
  for (int64_t i = 0; i < n;) {
    const int64_t start = i;
    UChar32 c = 0;
    U8_NEXT(p, i, n, c);
    if (c < 0) return static_cast<size_t>(start);
  }
  return std::string_view::npos;
}

}  // namespace

void check_key(const Reader& r, std::string_view key, uint64_t at, const FieldRef& field) {
  if (key.empty()) r.fail(field, at, "empty metadata key");
  if (key.size() > kMaxKeyBytes) {
    r.fail(field, at,
           "metadata key of " + std::to_string(key.size()) + " bytes is longer than the " +
               std::to_string(kMaxKeyBytes) + " gguf.md allows");
  }
  // gguf.md: keys are ASCII, dot-separated lower_snake_case segments. Only the
  // ASCII part is enforced (printable, no spaces: no segment can hold others),
  // as llama.cpp enforces none of it and keys here are only compared.
  for (size_t i = 0; i < key.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(key[i]);
    if (c <= 0x20 || c >= 0x7f) {
      r.fail(field, at,
             "metadata key " + quoted(key) + " has byte " + std::to_string(i) +
                 " outside printable ASCII (gguf.md: keys are ASCII)");
    }
  }
}

void check_tensor_name(const Reader& r, std::string_view name, uint64_t at,
                       const FieldRef& field) {
  // gguf.md: "at most 64 bytes long". (llama.cpp stores names in ggml's
  // char[GGML_MAX_NAME = 64] with a terminating NUL, so it takes at most 63.)
  if (name.size() > kMaxTensorNameBytes) {
    r.fail(field, at,
           "tensor name " + quoted(name) + " is " + std::to_string(name.size()) +
               " bytes, more than the " + std::to_string(kMaxTensorNameBytes) +
               " gguf.md allows");
  }
  if (const size_t bad = first_invalid_utf8(name); bad != std::string_view::npos) {
    r.fail(field, at,
           "tensor name " + quoted(name) + " is not valid UTF-8 (at name byte " +
               std::to_string(bad) + ")");
  }
}

}  // namespace activekv::gguf::detail
