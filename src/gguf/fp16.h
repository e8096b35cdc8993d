// Internal: exact binary16 -> binary32 conversion, inline so the dequant
// loops do not pay a call per element. Written out rather than relying on
// _Float16/F16C so the result is the same on every compiler and CPU.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

namespace activekv::gguf::detail {

inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) {  // inf / NaN: max exponent, payload shifted into place
    return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  }
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24 is exact in binary32 (mant < 2^10).
    const float mag = static_cast<float>(mant) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(mag));
  }
  // Normal: rebias the exponent from 15 to 127.
  return std::bit_cast<float>(sign | ((exp + (127 - 15)) << 23) | (mant << 13));
}

/// Reads an unaligned little-endian f16 field from a block and widens it.
inline float load_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_to_float(h);
}

}  // namespace activekv::gguf::detail
