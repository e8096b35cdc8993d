// lossless13: the lossless 13-bit page format of SPEC §3.2.
//
// A bf16 value is sign (1) | exponent (8) | mantissa (7). Within one plane
// (one KV head, K or V; n = n_tokens * head_dim values) the distinct exponent
// fields usually fit a 32-entry table, and each value is stored as
// sign (1) + table index (5) + mantissa (7) = 13 bits. Planes needing more
// than 32 exponents are stored raw. Exponent fields 0 (zero, subnormals) and
// 255 (inf, NaN) are table entries like any other, so every bit pattern
// round-trips exactly.
//
// Payload:
//   offsets[2 * n_kv_heads]  u32  byte offset of each plane from the payload
//                                 start; planes K0..K(H-1), V0..V(H-1), packed
//                                 back to back after this directory
//   plane:  mode u8 (0 = table, 1 = raw), n_exp u8,
//           table: n_exp u8 exponents, strictly ascending, 1 <= n_exp <= 32,
//                  then ceil(13 n / 8) bytes: 13-bit codes
//                  sign << 12 | index << 7 | mantissa, packed LSB-first
//                  (code i occupies bits [13 i, 13 i + 13) of the stream),
//                  unused high bits of the last byte zero;
//           raw:   n_exp = 0, then n bf16 values (2 n bytes, little-endian).
// Validation: directory matches the plane sizes, mode/n_exp legal, table
// strictly ascending, every index < n_exp, padding bits zero.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "activekv/kv/codec.h"

namespace activekv::kv {

/// How one plane is stored.
enum class Lossless13Mode : uint8_t { table = 0, raw = 1 };

/// Encodes a lossless13 page. Same contract as encode_page (any bf16 input).
EncodedPage encode_lossless13_page(const KvShape& shape, std::span<const bf16> page, int n_tokens);

/// A validated lossless13 page: its header and the blob it describes. Built
/// only by parse_lossless13_page, which validates everything once (header,
/// checksum, directory, every plane's table, indexes and padding); decoding
/// through a view validates nothing. The view does not own the bytes: the
/// blob (an EncodedPage's vector, or an arena slot) must outlive it unchanged.
struct Lossless13PageView {
  PageHeader header;
  std::span<const std::byte> blob;  ///< header + payload

  /// Planes in the page: 2 * n_kv_heads, ordered K0..K(H-1), V0..V(H-1).
  int n_planes() const { return 2 * header.n_kv_heads; }
  /// Storage mode of plane p in [0, n_planes()) (no check).
  Lossless13Mode mode(int p) const;
  /// Decodes the first n values (n <= n_tokens * head_dim: whole tokens or
  /// not) of plane p, bit-exact: as bf16 patterns, or widened exactly to
  /// fp32. Nothing is allocated; n and p are not checked.
  void decode_plane(int p, size_t n, bf16* out) const;
  void decode_plane(int p, size_t n, float* out) const;
};

/// Validates the blob completely and returns its view. Throws Error naming
/// the problem (see the file comment): nothing is decoded then.
Lossless13PageView parse_lossless13_page(std::span<const std::byte> blob);

/// Validates and decodes to bf16 in the PageStore layout (`out` holds
/// page_size * n_kv_heads * head_dim * 2 values; tokens >= n_tokens are set
/// to +0). Bit-exact inverse of the encoder. Throws Error (nothing read) if
/// the blob does not validate.
void decode_lossless13_page(const EncodedPage& page, std::span<bf16> out);
/// Same, from a validated view (no validation).
void decode_lossless13_page(const Lossless13PageView& page, std::span<bf16> out);

/// Per plane storage mode of a validated page, [K0..K(H-1), V0..V(H-1)].
std::vector<Lossless13Mode> lossless13_plane_modes(const EncodedPage& page);

/// Size of a full page blob (n_tokens = page_size) when every plane is raw.
size_t lossless13_raw_page_bytes(const KvShape& shape);

/// Payload bytes of one plane of n values in a mode (table: with n_exp entries).
size_t lossless13_plane_bytes(Lossless13Mode mode, size_t n_values, int n_exp);

}  // namespace activekv::kv
