// FNV-1a (64-bit) over token ids, each as 4 little-endian bytes, as 16 hex
// digits: how the tokenizer tests compare a whole corpus's ids with the
// golden files (tools/reference_tokens*.py compute the same hash).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

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

}  // namespace activekv::testing
