// File: ties the parsing stages together and serves lookups afterwards.
#include <optional>

#include "mapping.h"
#include "parse.h"

namespace activekv::gguf {

using detail::NameIndex;

struct File::Impl {
  std::optional<detail::Mapping> mapping;  // empty for from_memory
  uint64_t size = 0;
  uint32_t version = 0;
  uint64_t alignment = detail::kDefaultAlignment;
  uint64_t data_offset = 0;
  detail::Metadata metadata;
  NameIndex key_index;
  std::vector<TensorInfo> tensors;
  NameIndex tensor_index;

  /// Parses a whole image in file order: header, metadata, tensor infos, data.
  void parse(std::span<const uint8_t> bytes);
};

void File::Impl::parse(std::span<const uint8_t> bytes) {
  if (bytes.empty()) throw FormatError("header.magic", 0, "empty file");
  detail::Reader r(bytes);
  const detail::Header h = detail::parse_header(r);
  detail::MetadataResult m = detail::parse_metadata(r, h.kv_count);
  std::vector<uint64_t> offset_fields;
  tensors = detail::parse_tensor_infos(r, h.tensor_count, tensor_index, offset_fields);
  data_offset = detail::place_tensors(r, m.alignment, tensors, offset_fields);
  size = bytes.size();
  version = h.version;
  alignment = m.alignment;
  metadata = std::move(m.kvs);
  key_index = std::move(m.index);
}

namespace {

[[noreturn]] void missing(const char* what, std::string_view name) {
  throw Error(std::string("GGUF: ") + what + " '" + std::string(name) + "' not found");
}

/// Runs an accessor, re-throwing a type mismatch with the key named.
template <class F>
auto typed(std::string_view key, const Value& v, F&& get) -> decltype(get(v)) {
  try {
    return get(v);
  } catch (const Error& e) {
    throw Error("GGUF: metadata key '" + std::string(key) + "': " + e.what());
  }
}

}  // namespace

File::File(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
File::File(File&&) noexcept = default;
File& File::operator=(File&&) noexcept = default;
File::~File() = default;

File File::open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->mapping.emplace(path);  // its errors already name the path
  try {
    impl->parse(impl->mapping->bytes());
  } catch (const FormatError& e) {
    throw e.in_file(path);  // "bad magic" alone does not say which file
  }
  return File(std::move(impl));
}

File File::from_memory(std::span<const uint8_t> bytes) {
  auto impl = std::make_unique<Impl>();
  impl->parse(bytes);
  return File(std::move(impl));
}

uint32_t File::version() const { return impl_->version; }
uint64_t File::alignment() const { return impl_->alignment; }
uint64_t File::data_offset() const { return impl_->data_offset; }
uint64_t File::file_size() const { return impl_->size; }

const std::vector<std::pair<std::string, Value>>& File::metadata() const {
  return impl_->metadata;
}

const Value* File::find(std::string_view key) const {
  const auto it = impl_->key_index.find(key);
  return it == impl_->key_index.end() ? nullptr : &impl_->metadata[it->second].second;
}

namespace {
const Value& require(const File& f, std::string_view key) {
  const Value* v = f.find(key);
  if (v == nullptr) missing("metadata key", key);
  return *v;
}
}  // namespace

uint64_t File::get_u64(std::string_view key) const {
  return typed(key, require(*this, key), [](const Value& v) { return v.as_u64(); });
}
double File::get_f64(std::string_view key) const {
  return typed(key, require(*this, key), [](const Value& v) { return v.as_f64(); });
}
bool File::get_bool(std::string_view key) const {
  return typed(key, require(*this, key), [](const Value& v) { return v.as_bool(); });
}
const std::string& File::get_string(std::string_view key) const {
  return typed(key, require(*this, key),
               [](const Value& v) -> const std::string& { return v.as_string(); });
}
const std::vector<Value>& File::get_array(std::string_view key) const {
  return typed(key, require(*this, key),
               [](const Value& v) -> const std::vector<Value>& { return v.as_array(); });
}

uint64_t File::get_u64_or(std::string_view key, uint64_t fallback) const {
  return find(key) ? get_u64(key) : fallback;
}
double File::get_f64_or(std::string_view key, double fallback) const {
  return find(key) ? get_f64(key) : fallback;
}
bool File::get_bool_or(std::string_view key, bool fallback) const {
  return find(key) ? get_bool(key) : fallback;
}
std::string File::get_string_or(std::string_view key, std::string fallback) const {
  return find(key) ? get_string(key) : std::move(fallback);
}

const std::vector<TensorInfo>& File::tensors() const { return impl_->tensors; }

const TensorInfo* File::find_tensor(std::string_view name) const {
  const auto it = impl_->tensor_index.find(name);
  return it == impl_->tensor_index.end() ? nullptr : &impl_->tensors[it->second];
}

const TensorInfo& File::tensor(std::string_view name) const {
  const TensorInfo* t = find_tensor(name);
  if (t == nullptr) missing("tensor", name);
  return *t;
}

}  // namespace activekv::gguf
