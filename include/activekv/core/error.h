// Error types shared by every ActiveKV component.
//
// All recoverable failures (bad input files, impossible sizes, misuse of an
// API) are reported by throwing activekv::Error or a subclass. The message
// always names what was wrong; callers never need to parse it.
#pragma once

#include <stdexcept>
#include <string>

namespace activekv {

/// Base class of every exception ActiveKV throws on purpose.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

/// Thrown when an argument or configuration is out of range
/// (e.g. page_size == 0, a context longer than the model supports).
class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& what) : Error(what) {}
};

}  // namespace activekv
