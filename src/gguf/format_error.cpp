// FormatError: one place that decides how GGUF parse errors read, so every
// message has the same "GGUF: [<file>: ]<problem> (field <name> at byte <offset>)" shape.
#include "activekv/gguf/gguf.h"

namespace activekv::gguf {

namespace {
std::string format_message(const std::string& field, uint64_t byte_offset,
                           const std::string& problem, const std::string& file) {
  const std::string where = file.empty() ? "" : file + ": ";
  return "GGUF: " + where + problem + " (field " + field + " at byte " +
         std::to_string(byte_offset) + ")";
}
}  // namespace

FormatError::FormatError(const std::string& field, uint64_t byte_offset,
                         const std::string& problem, const std::string& file)
    : Error(format_message(field, byte_offset, problem, file)),
      field_(field),
      byte_offset_(byte_offset),
      problem_(problem),
      file_(file) {}

FormatError FormatError::in_file(const std::string& path) const {
  return FormatError(field_, byte_offset_, problem_, path);
}

}  // namespace activekv::gguf
