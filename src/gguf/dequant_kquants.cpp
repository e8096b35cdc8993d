// K-quant decoders: 256-element super-blocks of 16 or 32-element sub-blocks
// (ggml-common.h block_q4_K / block_q5_K / block_q6_K).
#include "dequant_blocks.h"
#include "fp16.h"

namespace activekv::gguf::detail {

namespace {

constexpr int kQK = 256;

/// Unpacks the 6-bit scale and min of sub-block j from the 12-byte packed
/// array shared by Q4_K and Q5_K (ggml's get_scale_min_k4): sub-blocks 0..3
/// use the low 6 bits of bytes 0..7; 4..7 take 4 bits from bytes 8..11 and
/// their top 2 bits from the high bits of bytes 0..7.
inline void scale_min_k4(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = static_cast<uint8_t>((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

}  // namespace

void dequant_q4_k(const uint8_t* src, float* dst, uint64_t n_blocks) {
  constexpr int kBytes = 144;  // f16 d, f16 dmin, 12 scale bytes, 128 nibble bytes
  for (uint64_t b = 0; b < n_blocks; ++b, src += kBytes) {
    const float d = load_half(src);
    const float dmin = load_half(src + 2);
    const uint8_t* scales = src + 4;
    const uint8_t* q = src + 16;
    // Each 64-element chunk: 32 low nibbles (sub-block is), 32 high (is+1).
    for (int j = 0, is = 0; j < kQK; j += 64, is += 2, q += 32) {
      uint8_t sc, m;
      scale_min_k4(is, scales, sc, m);
      const float d1 = d * sc, m1 = dmin * m;
      scale_min_k4(is + 1, scales, sc, m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *dst++ = d1 * static_cast<float>(q[l] & 0x0f) - m1;
      for (int l = 0; l < 32; ++l) *dst++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

void dequant_q5_k(const uint8_t* src, float* dst, uint64_t n_blocks) {
  constexpr int kBytes = 176;  // d, dmin, 12 scale bytes, 32 high-bit bytes, 128 nibble bytes
  for (uint64_t b = 0; b < n_blocks; ++b, src += kBytes) {
    const float d = load_half(src);
    const float dmin = load_half(src + 2);
    const uint8_t* scales = src + 4;
    const uint8_t* qh = src + 16;
    const uint8_t* ql = src + 48;
    // Chunk c of 64 takes its 5th bits from qh bits 2c (low half) and 2c+1 (high half).
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0, is = 0; j < kQK; j += 64, is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
      uint8_t sc, m;
      scale_min_k4(is, scales, sc, m);
      const float d1 = d * sc, m1 = dmin * m;
      scale_min_k4(is + 1, scales, sc, m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) {
        *dst++ = d1 * static_cast<float>((ql[l] & 0x0f) + (qh[l] & u1 ? 16 : 0)) - m1;
      }
      for (int l = 0; l < 32; ++l) {
        *dst++ = d2 * static_cast<float>((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
      }
    }
  }
}

void dequant_q6_k(const uint8_t* src, float* dst, uint64_t n_blocks) {
  constexpr int kBytes = 210;  // 128 ql, 64 qh, 16 int8 scales, f16 d
  for (uint64_t b = 0; b < n_blocks; ++b, src += kBytes) {
    const uint8_t* ql = src;
    const uint8_t* qh = src + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(src + 192);
    const float d = load_half(src + 208);
    // Two halves of 128: each qh byte carries the top 2 bits of four values
    // 32 apart; ql holds their low 4 bits (two halves of 64 bytes).
    for (int n = 0; n < kQK; n += 128, ql += 64, qh += 32, sc += 8, dst += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        dst[l] = d * sc[is] * static_cast<float>(q1);
        dst[l + 32] = d * sc[is + 2] * static_cast<float>(q2);
        dst[l + 64] = d * sc[is + 4] * static_cast<float>(q3);
        dst[l + 96] = d * sc[is + 6] * static_cast<float>(q4);
      }
    }
  }
}

}  // namespace activekv::gguf::detail
