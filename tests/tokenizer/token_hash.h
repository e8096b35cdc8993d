// What the tokenizer tests compare whole corpora by: FNV-1a (64-bit) over
// token ids, each as 4 little-endian bytes, as 16 hex digits (as
// tools/reference_tokens*.py compute it), and the golden files' "corpora"
// check shared by every model's tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "activekv/core/text_file.h"
#include "activekv/tokenizer/tokenizer.h"

namespace activekv::testing {

inline std::string fnv1a64(const std::vector<int32_t>& ids) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (int32_t id : ids) {
    const auto u = static_cast<uint32_t>(id);
    for (int k = 0; k < 4; ++k) {
      h ^= (u >> (8 * k)) & 0xFF;
      h *= 0x100000001B3ull;
    }
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

/// For each golden corpus {file, bytes, n_tokens, fnv1a64}: the first `bytes`
/// of data/texts/<file> encode to that many ids with that hash, and decode back.
inline void expect_corpora_match(const Tokenizer& tok, const nlohmann::json& corpora) {
  for (const auto& c : corpora) {
    const std::string name = c["file"].get<std::string>();
    std::string text = read_text_file(std::string(ACTIVEKV_SOURCE_DIR) + "/data/texts/" + name, "corpus");
    ASSERT_GE(text.size(), c["bytes"].get<size_t>()) << name;
    text.resize(c["bytes"].get<size_t>());
    const auto ids = tok.encode(text, false);
    EXPECT_EQ(ids.size(), c["n_tokens"].get<size_t>()) << name;
    EXPECT_EQ(fnv1a64(ids), c["fnv1a64"].get<std::string>()) << name;
    EXPECT_EQ(tok.decode(ids), text) << name;
  }
}

}  // namespace activekv::testing
