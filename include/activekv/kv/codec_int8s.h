// int8s: the separable 8-bit page format of SPEC §3.3.
//
// Payload, per KV head h = 0..n_kv_heads-1 in order (n = n_tokens, d = head_dim):
//   c[d]      fp16  key channel scales, finite, in [2^-14, 2^14]
//   s[n]      fp16  key token scales, finite, >= 0
//   kq[n][d]  int8  key codes in [-127, 127]
//   v[d]      fp16  value channel scales, finite, >= 0
//   vq[n][d]  int8  value codes in [-127, 127]
// Section size for one head: 2d + 2n + nd + 2d + nd bytes.
//
// Encoding (all intermediate arithmetic in double; fp16 rounding is
// round-to-nearest-even; "stored" = the fp16 value widened exactly):
//   r_j = sqrt(mean_t K[t,j]^2);  c_j = sqrt(r_j);  g = geometric mean of the
//   non-zero c_j;  c_j <- clamp(c_j / g, 2^-14, 2^14) (zero channel: 1);
//   c_j stored as fp16.
//   s_t = max_j |K[t,j] / c_j| / 127 with the *stored* c_j, stored as fp16.
//   kq[t,j] = clip(round_half_even(K[t,j] / (c_j * s_t)), -127, 127) with the
//   stored c_j, s_t (s_t = 0 gives code 0).
//   v_j = max_t |V[t,j]| / 127 stored as fp16;
//   vq[t,j] = clip(round_half_even(V[t,j] / v_j), -127, 127) (v_j = 0: code 0).
// Dequantised key: c_j * s_t * kq[t,j]; value: v_j * vq[t,j] (stored scales),
// so codes and dequantisation agree exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "activekv/kv/codec.h"
#include "activekv/kv/int8s_layout.h"  // the section offsets, shared with the GPU kernel

namespace activekv::kv {

static_assert(kInt8sPayloadOffset == kCodecHeaderBytes, "int8s_layout.h: the payload follows the codec header");

/// Key scaling used when encoding int8s.
enum class Int8sKeyScaling {
  separable,       ///< SPEC §3.3: channel scale c_j and token scale s_t
  per_token_only,  ///< c_j = 1 for every channel: the plain per-token 8-bit
                   ///< quantiser, kept only for the design comparison test
};

/// Encodes an int8s page (see the file comment). Same contract as encode_page.
EncodedPage encode_int8s_page(const KvShape& shape, std::span<const bf16> page, int n_tokens,
                              Int8sKeyScaling scaling = Int8sKeyScaling::separable);

/// One KV head of a validated int8s page: pointers to its sections inside
/// the blob (no copy). Scales are fp16, little-endian, at any alignment: read
/// them with c(), s(), v() (exact widening) or in bulk with fp16_to_f32.
/// Valid while the blob lives unchanged.
struct Int8sHeadView {
  const std::byte* c_fp16 = nullptr;  ///< [head_dim] key channel scales
  const std::byte* s_fp16 = nullptr;  ///< [n_tokens] key token scales
  const int8_t* kq = nullptr;         ///< [n_tokens][head_dim] key codes
  const std::byte* v_fp16 = nullptr;  ///< [head_dim] value channel scales
  const int8_t* vq = nullptr;         ///< [n_tokens][head_dim] value codes

  float c(size_t j) const;  ///< key channel scale j, widened exactly
  float s(size_t t) const;  ///< key token scale t
  float v(size_t j) const;  ///< value channel scale j
};

/// A validated int8s page: its header and the blob it describes. Built only
/// by parse_int8s_page, which validates everything once (header, checksum,
/// scales, codes); readers of a view (the attention kernels) validate
/// nothing. The view does not own the bytes: the blob (an EncodedPage's
/// vector, or an arena slot) must outlive it unchanged.
struct Int8sPageView {
  PageHeader header;
  std::span<const std::byte> blob;  ///< header + payload
  /// Sections of KV head h in [0, n_kv_heads) (computed from the header; no check).
  Int8sHeadView head(int h) const;
};

/// Validates header, checksum and metadata, then returns the view. Throws
/// Error naming the problem: wrong format, payload size not as the shape
/// implies, a scale NaN/inf/negative, a channel scale outside
/// [2^-14, 2^14], a code of -128.
Int8sPageView parse_int8s_page(std::span<const std::byte> blob);
/// Same, over an EncodedPage's bytes.
Int8sPageView parse_int8s_page(const EncodedPage& page);
/// The view aliases the blob: parsing a temporary would dangle.
Int8sPageView parse_int8s_page(EncodedPage&& page) = delete;

/// Widens `count` fp16 values (little-endian, any alignment) to fp32; exact.
void fp16_to_f32(const std::byte* src, size_t count, float* dst);

/// Payload bytes of an int8s page with these dimensions.
size_t int8s_payload_bytes(int n_kv_heads, int head_dim, int n_tokens);

}  // namespace activekv::kv
