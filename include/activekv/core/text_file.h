// Reading and writing whole text files (prompts, evaluation corpora, JSON
// results), with errors that name the file and the problem.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "activekv/core/error.h"

namespace activekv {

/// The bytes of `path`, read whole (binary: CRLF and a BOM are kept).
/// Throws Error naming `what` and `path`: "<what> '<path>' is a directory, not
/// a file", "cannot read <what> '<path>'" (missing, unreadable, or a read that
/// fails part way), "<what> '<path>' holds more than <max_bytes> bytes" (a
/// device like /dev/zero would otherwise be read until memory runs out).
inline std::string read_text_file(const std::string& path, const std::string& what = "file",
                                  size_t max_bytes = size_t(-1)) {
  // A directory opens as an ifstream on Linux and reads as empty: name it.
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw Error(what + " '" + path + "' is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + what + " '" + path + "': " + std::strerror(errno));
  std::string out;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    out.append(buf, size_t(in.gcount()));
    if (out.size() > max_bytes)
      throw Error(what + " '" + path + "' holds more than " + std::to_string(max_bytes) + " bytes");
  }
  if (in.bad()) throw Error("cannot read " + what + " '" + path + "': read error");
  return out;
}

/// Throws Error "<what> '<out>' is also an input of this run ('<input>'):
/// writing it would replace what the run reads" when `out` names an existing
/// file that one of `inputs` also names (after links and relative paths).
/// Empty inputs are skipped. Call it with check_writable, before the work.
inline void check_not_an_input(const std::string& out, const std::vector<std::string>& inputs,
                               const std::string& what) {
  for (const std::string& in : inputs) {
    std::error_code ec;
    if (!in.empty() && std::filesystem::equivalent(out, in, ec) && !ec)
      throw Error(what + " '" + out + "' is also an input of this run ('" + in +
                  "'): writing it would replace what the run reads");
  }
}

/// Checks that `path` could be written, without creating or changing it: call
/// it before a long run whose result goes there, so that a typo fails at once.
/// Throws Error "cannot write <what> '<path>': <reason>" when the path is a
/// directory, its folder does not exist or is not writable, or the file
/// exists and is not writable.
inline void check_writable(const std::string& path, const std::string& what = "file") {
  namespace fs = std::filesystem;
  auto fail = [&](const std::string& why) { throw Error("cannot write " + what + " '" + path + "': " + why); };
  std::error_code ec;
  if (path.empty()) fail("empty path");
  if (fs::is_directory(path, ec)) fail("it is a directory");
  if (fs::exists(path, ec)) {
    if (access(path.c_str(), W_OK) != 0) fail(std::strerror(errno));
    return;
  }
  const fs::path parent = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
  if (!fs::exists(parent, ec)) fail("folder '" + parent.string() + "' does not exist");
  if (!fs::is_directory(parent, ec)) fail("'" + parent.string() + "' is not a folder");
  if (access(parent.c_str(), W_OK | X_OK) != 0) fail("folder '" + parent.string() + "': " + std::strerror(errno));
}

/// Writes `text` to `path`, replacing it. Throws Error "cannot write <what>
/// '<path>': <reason>" if it cannot be opened or a byte does not reach it
/// (e.g. the disk is full: checked at close, where buffered bytes land).
inline void write_text_file(const std::string& path, std::string_view text, const std::string& what = "file") {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error("cannot write " + what + " '" + path + "': " + std::strerror(errno));
  out.write(text.data(), std::streamsize(text.size()));
  out.close();
  if (!out) throw Error("cannot write " + what + " '" + path + "': write failed: " + std::strerror(errno));
}

}  // namespace activekv
