// Reading a whole text file (prompts, evaluation corpora).
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include "activekv/core/error.h"

namespace activekv {

/// The bytes of `path`. Throws Error "cannot read <what> '<path>'" if it cannot be opened.
inline std::string read_text_file(const std::string& path, const std::string& what = "file") {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + what + " '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace activekv
