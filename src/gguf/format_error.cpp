// FormatError: one place that decides how GGUF parse errors read, so every
// message has the same "GGUF: <problem> (field <name> at byte <offset>)" shape.
#include "activekv/gguf/gguf.h"

namespace activekv::gguf {

namespace {
std::string format_message(const std::string& field, uint64_t byte_offset,
                           const std::string& problem) {
  return "GGUF: " + problem + " (field " + field + " at byte " + std::to_string(byte_offset) +
         ")";
}
}  // namespace

FormatError::FormatError(const std::string& field, uint64_t byte_offset,
                         const std::string& problem)
    : Error(format_message(field, byte_offset, problem)),
      field_(field),
      byte_offset_(byte_offset) {}

}  // namespace activekv::gguf
