// Internal: a cursor over the file bytes whose every read is bounds-checked.
//
// Reads never go past the end of the buffer; a short read throws FormatError
// naming the field being read and the offset where it starts. Field names are
// built lazily (FieldRef) because the hot path reads ~10^5 array elements and
// only the failing one ever needs its name formatted.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "activekv/gguf/gguf.h"

namespace activekv::gguf::detail {

/// A field name, optionally with an element index: "kv['x'].value" + "[12]".
/// Cheap to pass around; str() formats it only when an error is raised.
struct FieldRef {
  static constexpr uint64_t kNoIndex = ~uint64_t{0};
  std::string_view base;
  uint64_t index = kNoIndex;

  FieldRef(std::string_view b, uint64_t i = kNoIndex) : base(b), index(i) {}
  FieldRef(const char* b) : base(b) {}
  FieldRef(const std::string& b) : base(b) {}
  std::string str() const;
};

/// Bounds-checked little-endian reader over an in-memory GGUF image.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> bytes) : data_(bytes.data()), size_(bytes.size()) {}

  uint64_t pos() const { return pos_; }
  uint64_t size() const { return size_; }
  uint64_t remaining() const { return size_ - pos_; }
  const uint8_t* data() const { return data_; }

  /// Throws FormatError unless `n` more bytes are available.
  void need(uint64_t n, const FieldRef& field) const;
  /// Throws FormatError for `field` at byte `at` with `problem`.
  [[noreturn]] void fail(const FieldRef& field, uint64_t at, const std::string& problem) const;

  /// Reads one trivially-copyable little-endian scalar.
  template <class T>
  T scalar(const FieldRef& field) {
    need(sizeof(T), field);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));  // memcpy: the file gives no alignment guarantee
    pos_ += sizeof(T);
    return v;
  }
  uint32_t u32(const FieldRef& field) { return scalar<uint32_t>(field); }
  uint64_t u64(const FieldRef& field) { return scalar<uint64_t>(field); }

  /// gguf_string: u64 length then that many bytes (length checked first).
  std::string string(const FieldRef& field);
  /// Moves the cursor to `new_pos` (<= size()).
  void seek(uint64_t new_pos, const FieldRef& field);

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

/// Quotes a name for messages: 'name' (truncated and with non-printables escaped,
/// since names come from untrusted files).
std::string quoted(std::string_view name);
/// Appends "\xNN" for byte c.
void append_hex_escape(std::string& out, unsigned char c);

}  // namespace activekv::gguf::detail
