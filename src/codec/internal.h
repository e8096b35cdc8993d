// Internal helpers of the codec library: fp16 conversion, FNV-1a, little-endian
// field access, header writing and shared checks.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "activekv/kv/codec.h"

namespace activekv::kv::detail {

static_assert(std::endian::native == std::endian::little, "codec blobs are little-endian");

/// Exact binary16 -> binary32 widening.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    const float mag = static_cast<float>(mant) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(mag));
  }
  return std::bit_cast<float>(sign | ((exp + (127 - 15)) << 23) | (mant << 13));
}

/// double -> binary16, round to nearest, ties to even (one rounding: the
/// double is scaled by a power of two, which is exact, then rounded once).
/// Overflow gives +-inf, NaN gives a quiet NaN.
inline uint16_t double_to_half(double x) {
  const uint16_t sign = std::signbit(x) ? 0x8000u : 0u;
  const double a = std::fabs(x);
  if (std::isnan(x)) return uint16_t(sign | 0x7e00u);
  if (a >= 65520.0) return uint16_t(sign | 0x7c00u);  // 65504 + half an ulp ties to even = inf
  if (a < 0x1p-14) {  // subnormal range: value = m * 2^-24
    const double m = std::nearbyint(a * 0x1p24);  // m == 1024 encodes 2^-14 correctly
    return uint16_t(sign | uint16_t(m));
  }
  int e = 0;
  std::frexp(a, &e);  // a in [2^(e-1), 2^e)
  double m = std::nearbyint(std::ldexp(a, 11 - e));  // [1024, 2048]
  int biased = e - 1 + 15;
  if (m == 2048.0) {
    m = 1024.0;
    ++biased;
  }
  if (biased >= 31) return uint16_t(sign | 0x7c00u);
  return uint16_t(sign | uint16_t(biased << 10) | uint16_t(uint32_t(m) - 1024u));
}

/// FNV-1a 64-bit, continuing from `h`.
inline uint64_t fnv1a(std::span<const std::byte> data, uint64_t h = 0xcbf29ce484222325ull) {
  for (std::byte b : data) {
    h ^= uint64_t(b);
    h *= 0x100000001b3ull;
  }
  return h;
}

/// Checksum of a blob: bytes [0,32) and [40, end), i.e. all but the checksum field.
inline uint64_t blob_checksum(std::span<const std::byte> blob) {
  return fnv1a(blob.subspan(40), fnv1a(blob.first(32)));
}

template <class T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <class T>
void store(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

/// Allocates a blob of header + payload and writes the header fields
/// (checksum left zero: call finish_blob once the payload is written).
EncodedPage start_blob(CodecFormat f, const KvShape& shape, int n_tokens, size_t payload_bytes);
/// Writes the checksum.
void finish_blob(EncodedPage& page);

/// Validates shape/n_tokens/span for an encoder; throws InvalidArgument.
void check_encode_args(const char* what, const KvShape& shape, std::span<const bf16> page, int n_tokens);

/// read_header plus: format must be `f` and payload_bytes must equal `expected`
/// (computed by the caller from the header dimensions).
PageHeader expect_format(std::span<const std::byte> blob, CodecFormat f);

}  // namespace activekv::kv::detail
