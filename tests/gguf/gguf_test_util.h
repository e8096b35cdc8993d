// Shared helpers for the GGUF tests: fixture paths, file loading and a tiny
// in-memory GGUF builder for malformed inputs.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
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
  /// A STRING metadata kv.
  Builder& kv_str(const std::string& key, const std::string& v) {
    str(key);
    u32(static_cast<uint32_t>(ValueType::STRING));
    return str(v);
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

/// A well-formed GGUF assembled from parts, for tests that need a valid file
/// with one thing changed: edit `kvs` / `tensors`, then call bytes(). Tensor
/// data is laid out in order, each tensor at the next multiple of 32.
struct Parts {
  using WriteValue = std::function<void(Builder&)>;  ///< writes type id + value
  struct Kv {
    std::string key;
    WriteValue value;
  };
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    TensorType type = TensorType::F32;
  };
  std::vector<Kv> kvs;
  std::vector<Tensor> tensors;

  /// Replaces the value of `key`, or appends the key.
  Parts& set(const std::string& key, WriteValue v) {
    for (Kv& kv : kvs) {
      if (kv.key == key) {
        kv.value = std::move(v);
        return *this;
      }
    }
    kvs.push_back({key, std::move(v)});
    return *this;
  }
  Parts& erase(const std::string& key) {
    std::erase_if(kvs, [&](const Kv& kv) { return kv.key == key; });
    return *this;
  }
  Tensor* tensor(const std::string& name) {
    for (Tensor& t : tensors) {
      if (t.name == name) return &t;
    }
    return nullptr;
  }

  std::vector<uint8_t> bytes() const {
    Builder b;
    b.header(tensors.size(), kvs.size());
    for (const Kv& kv : kvs) {
      b.str(kv.key);
      kv.value(b);
    }
    uint64_t offset = 0;
    for (const Tensor& t : tensors) {
      b.tensor(t.name, t.dims, static_cast<uint32_t>(t.type), offset);
      offset += (n_bytes(t) + 31) / 32 * 32;
    }
    b.data(offset);
    return b.bytes;
  }

  static uint64_t n_bytes(const Tensor& t) {
    uint64_t rows = 1;
    for (size_t d = 1; d < t.dims.size(); ++d) rows *= t.dims[d];
    return row_bytes(t.type, t.dims.at(0)) * rows;
  }
};

/// Typed values for Parts::set.
inline Parts::WriteValue val_u32(uint32_t v) {
  return [v](Builder& b) { b.u32(uint32_t(ValueType::UINT32)).u32(v); };
}
inline Parts::WriteValue val_i32(int32_t v) {
  return [v](Builder& b) { b.u32(uint32_t(ValueType::INT32)).raw(&v, 4); };
}
inline Parts::WriteValue val_u64(uint64_t v) {
  return [v](Builder& b) { b.u32(uint32_t(ValueType::UINT64)).u64(v); };
}
inline Parts::WriteValue val_f32(float v) {
  return [v](Builder& b) { b.u32(uint32_t(ValueType::FLOAT32)).raw(&v, 4); };
}
inline Parts::WriteValue val_f64(double v) {
  return [v](Builder& b) { b.u32(uint32_t(ValueType::FLOAT64)).raw(&v, 8); };
}
inline Parts::WriteValue val_str(std::string v) {
  return [v](Builder& b) { b.u32(uint32_t(ValueType::STRING)).str(v); };
}
/// An ARRAY of n STRINGs "t0", "t1", ...
inline Parts::WriteValue val_str_array(uint64_t n) {
  return [n](Builder& b) {
    b.u32(uint32_t(ValueType::ARRAY)).u32(uint32_t(ValueType::STRING)).u64(n);
    for (uint64_t i = 0; i < n; ++i) b.str("t" + std::to_string(i));
  };
}

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
