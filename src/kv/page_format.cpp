#include "activekv/kv/page_format.h"

#include <fmt/format.h>

#include <cstring>

#include "activekv/core/bf16.h"
#include "activekv/core/error.h"

namespace activekv::kv {

size_t element_bytes(PageFormat f) { return f == PageFormat::f32 ? 4 : 2; }

std::string format_name(PageFormat f) { return f == PageFormat::f32 ? "f32" : "bf16"; }

PageFormat parse_page_format(const std::string& name) {
  if (name == "bf16") return PageFormat::bf16;
  if (name == "f32") return PageFormat::f32;
  throw InvalidArgument(fmt::format("unknown page format '{}' (expected bf16 or f32)", name));
}

void encode_elements(PageFormat f, const float* src, size_t n, std::byte* plane, size_t first) {
  if (f == PageFormat::f32) {
    std::memcpy(plane + first * sizeof(float), src, n * sizeof(float));
    return;
  }
  auto* dst = reinterpret_cast<bf16*>(plane) + first;
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

void decode_elements(PageFormat f, const std::byte* plane, size_t n, float* dst) {
  if (f == PageFormat::f32) {
    std::memcpy(dst, plane, n * sizeof(float));
    return;
  }
  const auto* src = reinterpret_cast<const bf16*>(plane);
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

}  // namespace activekv::kv
