// BFloat16 storage type: the top 16 bits of an IEEE-754 binary32.
//
// Conversion f32 -> bf16 rounds to nearest, ties to even, and keeps NaN a NaN
// (quiet bit forced) -- the same rule as PyTorch's and CUDA's __float2bfloat16.
// bf16 -> f32 is exact (shift left by 16).
#pragma once

#include <bit>
#include <cstdint>

namespace activekv {

/// One bf16 value, stored as its raw 16 bits.
struct bf16 {
  uint16_t bits = 0;
};

/// Exact widening: bf16 -> f32.
inline float bf16_to_f32(bf16 h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h.bits) << 16);
}

/// Narrowing with round-to-nearest-even; NaN stays NaN (payload top bits kept).
inline bf16 f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign and payload, force quiet
    return bf16{static_cast<uint16_t>((u >> 16) | 0x0040u)};
  }
  uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>((u + rounding_bias) >> 16)};
}

}  // namespace activekv
