// Header and metadata key/value parsing.
#include <bit>

#include "parse.h"

namespace activekv::gguf::detail {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32

/// Bytes the smallest value of type t occupies; used to bound array lengths
/// before any allocation (a string needs its 8-byte length, an array 12 bytes).
uint64_t min_encoded_size(ValueType t) {
  switch (t) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::BOOL: return 1;
    case ValueType::UINT16: case ValueType::INT16: return 2;
    case ValueType::UINT32: case ValueType::INT32: case ValueType::FLOAT32: return 4;
    case ValueType::UINT64: case ValueType::INT64: case ValueType::FLOAT64: return 8;
    case ValueType::STRING: return 8;
    case ValueType::ARRAY: return 4 + 8;
  }
  return 1;
}

ValueType read_value_type(Reader& r, const FieldRef& field) {
  const uint64_t at = r.pos();
  const uint32_t t = r.u32(field);
  if (t > static_cast<uint32_t>(ValueType::FLOAT64)) {
    r.fail(field, at, "unknown metadata value type " + std::to_string(t));
  }
  return static_cast<ValueType>(t);
}

Value parse_value(Reader& r, ValueType type, const FieldRef& field, int depth);

Value parse_array(Reader& r, const std::string& field, int depth) {
  if (depth >= kMaxArrayDepth) {
    r.fail(field, r.pos(), "arrays nested deeper than " + std::to_string(kMaxArrayDepth));
  }
  Value v;
  v.type = ValueType::ARRAY;
  v.array_type = read_value_type(r, field + ".array_type");
  const std::string len_field = field + ".array_length";
  const uint64_t at = r.pos();
  const uint64_t len = r.u64(len_field);
  // Reject before reserving: every element needs at least min_encoded_size bytes.
  if (len > r.remaining() / min_encoded_size(v.array_type)) {
    r.fail(len_field, at,
           "array length " + std::to_string(len) + " cannot fit in the " +
               std::to_string(r.remaining()) + " bytes remaining (truncated or corrupt)");
  }
  std::vector<Value> items;
  items.reserve(len);
  for (uint64_t i = 0; i < len; ++i) {
    if (v.array_type == ValueType::ARRAY) {
      items.push_back(parse_array(r, field + "[" + std::to_string(i) + "]", depth + 1));
    } else {
      items.push_back(parse_value(r, v.array_type, FieldRef(field, i), depth + 1));
    }
  }
  v.data = std::move(items);
  return v;
}

template <class Stored, class Raw>
Value scalar_value(Reader& r, ValueType type, const FieldRef& field) {
  Value v;
  v.type = type;
  v.data = static_cast<Stored>(r.scalar<Raw>(field));
  return v;
}

Value parse_value(Reader& r, ValueType type, const FieldRef& field, int depth) {
  switch (type) {
    case ValueType::UINT8: return scalar_value<uint64_t, uint8_t>(r, type, field);
    case ValueType::INT8: return scalar_value<int64_t, int8_t>(r, type, field);
    case ValueType::UINT16: return scalar_value<uint64_t, uint16_t>(r, type, field);
    case ValueType::INT16: return scalar_value<int64_t, int16_t>(r, type, field);
    case ValueType::UINT32: return scalar_value<uint64_t, uint32_t>(r, type, field);
    case ValueType::INT32: return scalar_value<int64_t, int32_t>(r, type, field);
    case ValueType::UINT64: return scalar_value<uint64_t, uint64_t>(r, type, field);
    case ValueType::INT64: return scalar_value<int64_t, int64_t>(r, type, field);
    case ValueType::FLOAT32: return scalar_value<double, float>(r, type, field);
    case ValueType::FLOAT64: return scalar_value<double, double>(r, type, field);
    case ValueType::BOOL: {
      const uint64_t at = r.pos();
      const uint8_t b = r.scalar<uint8_t>(field);
      if (b > 1) r.fail(field, at, "bool byte is " + std::to_string(b) + ", expected 0 or 1");
      Value v;
      v.type = type;
      v.data = b == 1;
      return v;
    }
    case ValueType::STRING: {
      Value v;
      v.type = type;
      v.data = r.string(field);
      return v;
    }
    case ValueType::ARRAY: return parse_array(r, field.str(), depth);
  }
  r.fail(field, r.pos(), "unknown metadata value type");
}

/// Keys whose value type gguf.md fixes ("Standardized key-value pairs") and
/// that this engine reads. A wrong type is a malformed file, reported here
/// rather than later as a confusing failure of whatever reads the key.
struct TypedKey {
  std::string_view key;
  ValueType type;
};
constexpr TypedKey kTypedKeys[] = {
    {"general.architecture", ValueType::STRING},
    {"general.alignment", ValueType::UINT32},
    {"general.quantization_version", ValueType::UINT32},
    {"general.name", ValueType::STRING},
};

void check_spec_type(const Reader& r, const std::string& key, ValueType type, uint64_t at,
                     const FieldRef& field) {
  for (const TypedKey& k : kTypedKeys) {
    if (k.key == key && k.type != type) {
      r.fail(field, at,
             key + " must be of type " + value_type_name(k.type) + " (gguf.md), not " +
                 value_type_name(type));
    }
  }
}

/// general.alignment (already known to be UINT32): a power of two and, as
/// gguf.md requires, a multiple of kMinAlignment.
uint64_t check_alignment(const Reader& r, const Value& v, uint64_t at) {
  const uint64_t a = std::get<uint64_t>(v.data);
  if (!std::has_single_bit(a) || a < kMinAlignment) {
    r.fail("kv['general.alignment']", at,
           "general.alignment " + std::to_string(a) + " is not a power of two >= " +
               std::to_string(kMinAlignment));
  }
  return a;
}

}  // namespace

Header parse_header(Reader& r) {
  Header h;
  if (r.u32("header.magic") != kMagic) r.fail("header.magic", 0, "bad magic, not a GGUF file");
  h.version = r.u32("header.version");
  if (h.version < 2 || h.version > 3) {
    r.fail("header.version", 4,
           "unsupported GGUF version " + std::to_string(h.version) + " (only 2 and 3 are read)");
  }
  h.tensor_count = r.u64("header.tensor_count");
  h.kv_count = r.u64("header.kv_count");
  if (h.kv_count > r.remaining() / kMinKvBytes) {
    r.fail("header.kv_count", 16,
           "kv_count " + std::to_string(h.kv_count) + " cannot fit in the file (truncated or corrupt)");
  }
  if (h.tensor_count > r.remaining() / kMinTensorInfoBytes) {
    r.fail("header.tensor_count", 8,
           "tensor_count " + std::to_string(h.tensor_count) + " cannot fit in the file (truncated or corrupt)");
  }
  return h;
}

MetadataResult parse_metadata(Reader& r, uint64_t kv_count) {
  MetadataResult m;
  m.kvs.reserve(kv_count);  // bounded by parse_header against the file size
  for (uint64_t i = 0; i < kv_count; ++i) {
    const uint64_t key_at = r.pos();
    const std::string index_field = "kv[" + std::to_string(i) + "].key";
    std::string key = r.string(index_field);
    check_key(r, key, key_at, index_field);
    const std::string prefix = "kv[" + quoted(key) + "]";
    if (m.index.count(key)) r.fail(prefix + ".key", key_at, "duplicate metadata key " + quoted(key));
    const uint64_t type_at = r.pos();
    const ValueType type = read_value_type(r, prefix + ".type");
    check_spec_type(r, key, type, type_at, prefix + ".type");
    const uint64_t value_at = r.pos();
    Value v = parse_value(r, type, prefix + ".value", 0);
    if (key == "general.alignment") m.alignment = check_alignment(r, v, value_at);
    m.index.emplace(key, m.kvs.size());
    m.kvs.emplace_back(std::move(key), std::move(v));
  }
  return m;
}

}  // namespace activekv::gguf::detail
