// Shared helpers for the GGUF tests: fixture paths, file loading and a tiny
// in-memory GGUF builder for malformed inputs.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "activekv/gguf/gguf.h"

namespace activekv::gguf::testing {

inline std::string fixture_path(const std::string& name) {
  return std::string(ACTIVEKV_SOURCE_DIR) + "/tests/fixtures/gguf/" + name;
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// Appends little-endian GGUF primitives to a byte vector. Deliberately
/// dumb: it writes whatever it is told, so tests can write invalid files.
class Builder {
 public:
  std::vector<uint8_t> bytes;

  Builder& u8(uint8_t v) { return raw(&v, 1); }
  Builder& u32(uint32_t v) { return raw(&v, 4); }
  Builder& u64(uint64_t v) { return raw(&v, 8); }
  Builder& str(const std::string& s) {
    u64(s.size());
    return raw(s.data(), s.size());
  }
  /// "GGUF", version, tensor_count, kv_count.
  Builder& header(uint64_t tensor_count, uint64_t kv_count, uint32_t version = 3) {
    raw("GGUF", 4);
    u32(version);
    u64(tensor_count);
    return u64(kv_count);
  }
  /// A UINT32 metadata kv.
  Builder& kv_u32(const std::string& key, uint32_t v) {
    str(key);
    u32(static_cast<uint32_t>(ValueType::UINT32));
    return u32(v);
  }
  /// A tensor info with the given dims, type id and relative offset.
  Builder& tensor(const std::string& name, const std::vector<uint64_t>& dims, uint32_t type,
                  uint64_t offset) {
    str(name);
    u32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) u64(d);
    u32(type);
    return u64(offset);
  }
  /// Zero padding up to a multiple of `alignment`, then `n` data bytes.
  Builder& data(uint64_t n, uint64_t alignment = 32) {
    while (bytes.size() % alignment != 0) bytes.push_back(0);
    bytes.resize(bytes.size() + n, 0x11);
    return *this;
  }
  Builder& raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes.insert(bytes.end(), b, b + n);
    return *this;
  }
};

/// Parses a copy of `bytes` held in an exactly-sized heap buffer (so ASan
/// flags any read past the end). Returns the FormatError thrown, or nullopt
/// if the bytes parsed. Any other exception propagates and fails the test.
inline std::optional<FormatError> try_parse(const std::vector<uint8_t>& bytes) {
  auto copy = std::make_unique<uint8_t[]>(bytes.size());
  if (!bytes.empty()) std::memcpy(copy.get(), bytes.data(), bytes.size());
  try {
    File::from_memory({copy.get(), bytes.size()});
  } catch (const FormatError& e) {
    return e;
  }
  return std::nullopt;
}

}  // namespace activekv::gguf::testing
