// Byte layout of an int8s page payload (SPEC §3.3; fields and encoding in
// codec_int8s.h): the one definition the CPU codec and the GPU kernel
// (src/cuda/int8s_attention.cu) both address the sections with.
//
// No dependencies and everything constexpr, so nvcc compiles it into device
// code; AKV_HOST_DEVICE is __host__ __device__ under nvcc and empty for the
// plain C++ build.
#pragma once

#include <cstddef>

#if defined(__CUDACC__)
#define AKV_HOST_DEVICE __host__ __device__
#else
#define AKV_HOST_DEVICE
#endif

namespace activekv::kv {

/// Where the payload starts in a blob: the codec header's size
/// (kCodecHeaderBytes of codec.h; codec_int8s.h checks they agree).
inline constexpr size_t kInt8sPayloadOffset = 64;

/// Offsets inside one KV head's section of an int8s payload with `head_dim`
/// channels and `n_tokens` tokens. Sections follow each other, head 0 first,
/// right after the 64-byte codec header. Units: bytes from the section start.
///   c[d]      fp16  key channel scales     at key_channel_scales()
///   s[n]      fp16  key token scales       at key_token_scales()
///   kq[n][d]  int8  key codes              at key_codes()
///   v[d]      fp16  value channel scales   at value_channel_scales()
///   vq[n][d]  int8  value codes            at value_codes()
struct Int8sSectionLayout {
  size_t head_dim = 0;
  size_t n_tokens = 0;

  AKV_HOST_DEVICE constexpr size_t key_channel_scales() const { return 0; }
  AKV_HOST_DEVICE constexpr size_t key_token_scales() const { return 2 * head_dim; }
  AKV_HOST_DEVICE constexpr size_t key_codes() const { return key_token_scales() + 2 * n_tokens; }
  AKV_HOST_DEVICE constexpr size_t value_channel_scales() const { return key_codes() + n_tokens * head_dim; }
  AKV_HOST_DEVICE constexpr size_t value_codes() const { return value_channel_scales() + 2 * head_dim; }
  /// Bytes of one head's section: 2d + 2n + nd + 2d + nd.
  AKV_HOST_DEVICE constexpr size_t bytes() const { return value_codes() + n_tokens * head_dim; }
  /// Payload bytes of a page of `n_kv_heads` such sections.
  AKV_HOST_DEVICE constexpr size_t payload_bytes(int n_kv_heads) const { return size_t(n_kv_heads) * bytes(); }
  /// Where head `h`'s section starts, in bytes from the start of the blob (header included).
  AKV_HOST_DEVICE constexpr size_t head_offset(int h) const { return kInt8sPayloadOffset + size_t(h) * bytes(); }
};

}  // namespace activekv::kv
