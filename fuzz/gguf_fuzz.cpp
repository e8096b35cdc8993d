// libFuzzer target for the GGUF reader.
//
// Contract under test: for ANY byte string, File::from_memory either parses
// or throws gguf::FormatError -- no crash, no out-of-bounds read, no other
// exception, no huge allocation. When it parses, every accessor and the
// dequantisation of every tensor must stay inside the buffer too.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "activekv/gguf/gguf.h"

namespace {

using namespace activekv::gguf;

/// Bounds the work per input; tensors in fuzz inputs are tiny anyway since
/// their bytes must lie inside the input.
constexpr uint64_t kMaxDequantElements = uint64_t{1} << 20;

/// The spec rules the reader promises to have enforced on a parsed file:
/// names at most 64 bytes, tensor data ranges disjoint.
void check_invariants(const File& file) {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const TensorInfo& t : file.tensors()) {
    if (t.name.size() > 64) __builtin_trap();
    ranges.emplace_back(t.offset, t.offset + t.n_bytes);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) __builtin_trap();
  }
}

void exercise(const File& file) {
  check_invariants(file);
  for (const auto& [key, value] : file.metadata()) {
    (void)value.to_string();
    (void)file.find(key);
  }
  std::vector<float> out;
  for (const TensorInfo& t : file.tensors()) {
    if (file.find_tensor(t.name) != &t) __builtin_trap();
    if (t.offset + t.n_bytes > file.file_size()) __builtin_trap();
    if (t.n_elements > kMaxDequantElements) continue;
    out.resize(t.n_elements);
    dequantize(t.type, t.data, out.data(), t.n_elements);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const File file = File::from_memory({data, size});
    exercise(file);
  } catch (const FormatError&) {
    // Expected for malformed input. Anything else escapes and is reported.
  }
  return 0;
}
