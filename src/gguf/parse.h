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
/// gguf.md: tensor names are at most 64 bytes, keys at most 65535.
constexpr uint64_t kMaxTensorNameBytes = 64;
constexpr uint64_t kMaxKeyBytes = 65535;
/// gguf.md: general.alignment "must be a multiple of 8"; we also need a power
/// of two (data offsets are rounded up with a mask, as ggml does).
constexpr uint64_t kMinAlignment = 8;

/// Rejects an empty key, one over kMaxKeyBytes, or one with a byte outside
/// printable ASCII (0x21..0x7e). `at` is where the key's string starts.
void check_key(const Reader& r, std::string_view key, uint64_t at, const FieldRef& field);
/// Rejects a tensor name over kMaxTensorNameBytes or not valid UTF-8.
void check_tensor_name(const Reader& r, std::string_view name, uint64_t at,
                       const FieldRef& field);

/// Magic, version (2 or 3), tensor_count and kv_count.
Header parse_header(Reader& r);

struct MetadataResult {
  Metadata kvs;
  NameIndex index;
  uint64_t alignment = kDefaultAlignment;
};
/// kv_count key/value pairs; rejects bad or duplicate keys, a wrongly typed
/// key whose type gguf.md fixes (general.architecture, general.alignment, ...)
/// and a general.alignment that is not a power of two >= kMinAlignment.
MetadataResult parse_metadata(Reader& r, uint64_t kv_count);

/// tensor_count tensor infos; offsets are left relative to the data section.
/// `offset_fields[i]` receives the byte position of tensor i's offset field.
std::vector<TensorInfo> parse_tensor_infos(Reader& r, uint64_t tensor_count, NameIndex& index,
                                           std::vector<uint64_t>& offset_fields);

/// Computes the data section start (aligned end of the infos), then makes
/// every tensor offset absolute, checking alignment, that its data lies in
/// the file, and that no two tensors' data overlap.
uint64_t place_tensors(const Reader& r, uint64_t alignment, std::vector<TensorInfo>& tensors,
                       const std::vector<uint64_t>& offset_fields);

}  // namespace activekv::gguf::detail
