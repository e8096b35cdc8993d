// Value accessors. Integers are stored widened (unsigned -> uint64, signed ->
// int64) so the accessors only need range checks between the two.
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "activekv/core/printable.h"
#include "activekv/gguf/gguf.h"
#include "reader.h"

namespace activekv::gguf {

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::UINT8: return "UINT8";
    case ValueType::INT8: return "INT8";
    case ValueType::UINT16: return "UINT16";
    case ValueType::INT16: return "INT16";
    case ValueType::UINT32: return "UINT32";
    case ValueType::INT32: return "INT32";
    case ValueType::FLOAT32: return "FLOAT32";
    case ValueType::BOOL: return "BOOL";
    case ValueType::STRING: return "STRING";
    case ValueType::ARRAY: return "ARRAY";
    case ValueType::UINT64: return "UINT64";
    case ValueType::INT64: return "INT64";
    case ValueType::FLOAT64: return "FLOAT64";
  }
  return "?";
}

namespace {

[[noreturn]] void wrong_type(const Value& v, const char* wanted) {
  throw Error(std::string("GGUF value is ") + value_type_name(v.type) + ", not " + wanted);
}

}  // namespace

std::string printable(const std::string& s) { return activekv::printable(s); }

bool Value::is_integer() const {
  return std::holds_alternative<uint64_t>(data) || std::holds_alternative<int64_t>(data);
}

uint64_t Value::as_u64() const {
  if (const auto* u = std::get_if<uint64_t>(&data)) return *u;
  if (const auto* i = std::get_if<int64_t>(&data)) {
    if (*i < 0) throw Error("GGUF value " + std::to_string(*i) + " is negative, expected unsigned");
    return static_cast<uint64_t>(*i);
  }
  wrong_type(*this, "an integer");
}

int64_t Value::as_i64() const {
  if (const auto* i = std::get_if<int64_t>(&data)) return *i;
  if (const auto* u = std::get_if<uint64_t>(&data)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw Error("GGUF value " + std::to_string(*u) + " does not fit in int64");
    }
    return static_cast<int64_t>(*u);
  }
  wrong_type(*this, "an integer");
}

double Value::as_f64() const {
  if (const auto* d = std::get_if<double>(&data)) return *d;
  if (const auto* u = std::get_if<uint64_t>(&data)) return static_cast<double>(*u);
  if (const auto* i = std::get_if<int64_t>(&data)) return static_cast<double>(*i);
  wrong_type(*this, "a number");
}

bool Value::as_bool() const {
  if (const auto* b = std::get_if<bool>(&data)) return *b;
  wrong_type(*this, "BOOL");
}

const std::string& Value::as_string() const {
  if (const auto* s = std::get_if<std::string>(&data)) return *s;
  wrong_type(*this, "STRING");
}

const std::vector<Value>& Value::as_array() const {
  if (const auto* a = std::get_if<std::vector<Value>>(&data)) return *a;
  wrong_type(*this, "ARRAY");
}

std::string Value::to_string(size_t max_items) const {
  std::ostringstream os;
  if (const auto* u = std::get_if<uint64_t>(&data)) {
    os << *u;
  } else if (const auto* i = std::get_if<int64_t>(&data)) {
    os << *i;
  } else if (const auto* d = std::get_if<double>(&data)) {
    os.precision(type == ValueType::FLOAT32 ? 9 : 17);
    os << *d;
  } else if (const auto* b = std::get_if<bool>(&data)) {
    os << (*b ? "true" : "false");
  } else if (const auto* s = std::get_if<std::string>(&data)) {
    os << '"' << printable(*s) << '"';
  } else if (const auto* a = std::get_if<std::vector<Value>>(&data)) {
    os << '[';
    for (size_t k = 0; k < a->size() && k < max_items; ++k) {
      os << (k ? ", " : "") << (*a)[k].to_string(max_items);
    }
    if (a->size() > max_items) os << ", ... (" << a->size() << " items)";
    os << ']';
  }
  return os.str();
}

}  // namespace activekv::gguf
