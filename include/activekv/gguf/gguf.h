// GGUF v3 reader: header, metadata key/values, tensor infos, tensor data.
//
// Format reference: ggml's docs/gguf.md (GGUF v3, little endian). The file is
// memory-mapped read-only; tensor data pointers point into the mapping and stay
// valid for the lifetime of the File.
//
// Every count, string length, array length, tensor dimension, offset and
// extent is checked against the file size before it is used, and every rule
// of the specification that a reader can check is enforced (docs/gguf.md in
// this tree lists them, and the few it deliberately leaves unchecked). A
// malformed file raises gguf::FormatError, whose message names the field and
// the byte offset at which it was read; the reader never reads outside the file.
//
// Strings: metadata keys must be printable ASCII and tensor names valid UTF-8
// (gguf.md). String *values* are kept as the raw bytes of the file and are not
// required to be UTF-8: vocabularies of byte-level tokenizers store tokens that
// are partial UTF-8 sequences, and llama.cpp loads such files.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "activekv/core/error.h"
#include "activekv/gguf/tensor_type.h"

namespace activekv::gguf {

/// A malformed or unsupported GGUF file. what() names the file (when read by
/// File::open), the field and the offset, e.g. "GGUF: model.gguf: tensor
/// 'blk.0.attn_q.weight' data extent [off, off+n) exceeds file size 1234
/// (field tensor_infos[3].offset at byte 812)".
class FormatError : public Error {
 public:
  /// `file` is the path the bytes came from, or empty (File::from_memory).
  FormatError(const std::string& field, uint64_t byte_offset, const std::string& problem,
              const std::string& file = "");
  /// The same error with `path` named as the file it was read from.
  FormatError in_file(const std::string& path) const;
  const std::string& field() const { return field_; }
  uint64_t byte_offset() const { return byte_offset_; }
  const std::string& problem() const { return problem_; }
  const std::string& file() const { return file_; }

 private:
  std::string field_;
  uint64_t byte_offset_;
  std::string problem_;
  std::string file_;
};

/// A string read from the file, safe for one line of a message
/// (activekv::printable, core/printable.h).
std::string printable(const std::string& s);

/// GGUF metadata value types (gguf.md "gguf_metadata_value_type").
enum class ValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5,
  FLOAT32 = 6, BOOL = 7, STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};

/// "UINT32", "STRING", ... as gguf.md spells them; "?" for an id out of range.
const char* value_type_name(ValueType t);

/// One metadata value. Arrays hold homogeneous elements of `array_type`
/// (nested arrays are allowed by the format and are parsed recursively).
struct Value {
  ValueType type = ValueType::UINT8;
  ValueType array_type = ValueType::UINT8;  // meaningful only when type == ARRAY
  // Scalars: integers widened to int64/uint64, floats to double.
  std::variant<std::monostate, uint64_t, int64_t, double, bool, std::string,
               std::vector<Value>>
      data;

  bool is_integer() const;
  /// Any integer type as uint64 / int64; throws Error if not an integer or out of range.
  uint64_t as_u64() const;
  int64_t as_i64() const;
  /// FLOAT32/FLOAT64 (and integers) as double; throws Error otherwise.
  double as_f64() const;
  bool as_bool() const;
  const std::string& as_string() const;
  const std::vector<Value>& as_array() const;
  /// Short human-readable rendering (arrays abbreviated), for `activekv inspect`.
  std::string to_string(size_t max_items = 8) const;
};

/// One tensor as described by its tensor info.
/// dims[0] is the fastest-varying (contiguous) dimension, as in ggml's ne[].
struct TensorInfo {
  std::string name;          ///< at most 64 bytes, valid UTF-8, unique in the file
  std::vector<uint64_t> dims;
  TensorType type = TensorType::F32;
  uint64_t offset = 0;       ///< byte offset of the data from the file start (absolute)
  uint64_t n_elements = 0;   ///< product of dims (checked for overflow)
  uint64_t n_bytes = 0;      ///< bytes of data (inside the file; no other tensor's data overlaps it)
  const uint8_t* data = nullptr;  ///< points into the mapping
};

/// An opened GGUF file (v2 and v3 accepted; v1 rejected).
class File {
 public:
  /// Memory-maps `path` read-only and parses it. Throws Error if the file
  /// cannot be opened, FormatError if it is malformed; both name `path`.
  static File open(const std::string& path);
  /// Parses a buffer owned by the caller (must outlive the File). For tests and fuzzing.
  static File from_memory(std::span<const uint8_t> bytes);

  File(File&&) noexcept;
  File& operator=(File&&) noexcept;
  ~File();

  uint32_t version() const;
  uint64_t alignment() const;      ///< general.alignment (UINT32, power of two >= 8), default 32
  uint64_t data_offset() const;    ///< start of the tensor data section
  uint64_t file_size() const;

  /// Metadata in file order. Keys are unique, non-empty printable ASCII.
  const std::vector<std::pair<std::string, Value>>& metadata() const;
  /// nullptr if absent.
  const Value* find(std::string_view key) const;
  /// Typed getters: throw Error naming the key if it is missing or of the wrong type.
  uint64_t get_u64(std::string_view key) const;
  double get_f64(std::string_view key) const;
  bool get_bool(std::string_view key) const;
  const std::string& get_string(std::string_view key) const;
  const std::vector<Value>& get_array(std::string_view key) const;
  /// Same, returning `fallback` if the key is absent (still throw on a wrong type).
  uint64_t get_u64_or(std::string_view key, uint64_t fallback) const;
  double get_f64_or(std::string_view key, double fallback) const;
  bool get_bool_or(std::string_view key, bool fallback) const;
  std::string get_string_or(std::string_view key, std::string fallback) const;

  const std::vector<TensorInfo>& tensors() const;
  /// nullptr if absent.
  const TensorInfo* find_tensor(std::string_view name) const;
  /// Throws Error naming the tensor if absent.
  const TensorInfo& tensor(std::string_view name) const;

 private:
  struct Impl;
  explicit File(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace activekv::gguf
