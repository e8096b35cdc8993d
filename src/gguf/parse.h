// Internal: the parsing stages of a GGUF image, in file order. Each stage
// validates what it reads against the bytes that remain before using it.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "activekv/gguf/gguf.h"
#include "reader.h"

namespace activekv::gguf::detail {

/// Name -> position in the owning vector; std::less<> allows string_view lookups.
using NameIndex = std::map<std::string, size_t, std::less<>>;
using Metadata = std::vector<std::pair<std::string, Value>>;

struct Header {
  uint32_t version = 0;
  uint64_t tensor_count = 0;
  uint64_t kv_count = 0;
};

/// Default data alignment when general.alignment is absent (gguf.md).
constexpr uint64_t kDefaultAlignment = 32;
/// Nested arrays recurse; this bounds the stack depth a hostile file can force.
constexpr int kMaxArrayDepth = 16;
/// Smallest possible encodings, used to reject counts that cannot fit.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;               // key length, type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // name len, n_dims, 1 dim, type, offset
constexpr uint32_t kMaxDims = 4;

/// Magic, version (2 or 3), tensor_count and kv_count.
Header parse_header(Reader& r);

struct MetadataResult {
  Metadata kvs;
  NameIndex index;
  uint64_t alignment = kDefaultAlignment;
};
/// kv_count key/value pairs; rejects duplicate keys and validates general.alignment.
MetadataResult parse_metadata(Reader& r, uint64_t kv_count);

/// tensor_count tensor infos; offsets are left relative to the data section.
/// `offset_fields[i]` receives the byte position of tensor i's offset field.
std::vector<TensorInfo> parse_tensor_infos(Reader& r, uint64_t tensor_count, NameIndex& index,
                                           std::vector<uint64_t>& offset_fields);

/// Computes the data section start (aligned end of the infos), then makes
/// every tensor offset absolute, checking alignment and that it lies in the file.
uint64_t place_tensors(const Reader& r, uint64_t alignment, std::vector<TensorInfo>& tensors,
                       const std::vector<uint64_t>& offset_fields);

}  // namespace activekv::gguf::detail
