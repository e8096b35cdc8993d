// dequantize(): validates the request, then dispatches to a block decoder.
// Also holds the element-wise (F32/F16/BF16) and 32-element block formats.
#include <cstring>

#include "activekv/core/bf16.h"
#include "activekv/core/error.h"
#include "activekv/gguf/tensor_type.h"
#include "dequant_blocks.h"
#include "fp16.h"

namespace activekv::gguf {

namespace detail {

void dequant_q4_0(const uint8_t* src, float* dst, uint64_t n_blocks) {
  constexpr int kBytes = 18;  // f16 d, 16 bytes of nibbles
  for (uint64_t b = 0; b < n_blocks; ++b, src += kBytes, dst += 32) {
    const float d = load_half(src);
    const uint8_t* qs = src + 2;
    for (int j = 0; j < 16; ++j) {  // low nibbles are elements 0..15, high 16..31
      dst[j] = static_cast<float>((qs[j] & 0x0f) - 8) * d;
      dst[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
  }
}

void dequant_q4_1(const uint8_t* src, float* dst, uint64_t n_blocks) {
  constexpr int kBytes = 20;  // f16 d, f16 m, 16 bytes of nibbles
  for (uint64_t b = 0; b < n_blocks; ++b, src += kBytes, dst += 32) {
    const float d = load_half(src);
    const float m = load_half(src + 2);
    const uint8_t* qs = src + 4;
    for (int j = 0; j < 16; ++j) {
      dst[j] = static_cast<float>(qs[j] & 0x0f) * d + m;
      dst[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
    }
  }
}

// Gemma 3 270M's Q4_K_M file stores attn_q/attn_k/ffn_gate/ffn_up in Q5_0.
void dequant_q5_0(const uint8_t* src, float* dst, uint64_t n_blocks) {
  constexpr int kBytes = 22;  // f16 d, 4 bytes of fifth bits (qh), 16 bytes of nibbles
  for (uint64_t b = 0; b < n_blocks; ++b, src += kBytes, dst += 32) {
    const float d = load_half(src);
    uint32_t qh = 0;
    std::memcpy(&qh, src + 2, 4);  // little-endian, as ggml reads it
    const uint8_t* qs = src + 6;
    for (int j = 0; j < 16; ++j) {  // bit j of qh tops element j, bit j+16 element j+16
      const int x0 = ((qs[j] & 0x0f) | (((qh >> j) << 4) & 0x10)) - 16;
      const int x1 = ((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16;
      dst[j] = static_cast<float>(x0) * d;
      dst[j + 16] = static_cast<float>(x1) * d;
    }
  }
}

void dequant_q8_0(const uint8_t* src, float* dst, uint64_t n_blocks) {
  constexpr int kBytes = 34;  // f16 d, 32 int8
  for (uint64_t b = 0; b < n_blocks; ++b, src += kBytes, dst += 32) {
    const float d = load_half(src);
    const auto* qs = reinterpret_cast<const int8_t*>(src + 2);
    for (int j = 0; j < 32; ++j) dst[j] = static_cast<float>(qs[j]) * d;
  }
}

}  // namespace detail

namespace {

void convert_f16(const uint8_t* src, float* dst, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) dst[i] = detail::load_half(src + 2 * i);
}

void convert_bf16(const uint8_t* src, float* dst, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    bf16 h;
    std::memcpy(&h.bits, src + 2 * i, 2);
    dst[i] = bf16_to_f32(h);
  }
}

}  // namespace

void dequantize(TensorType t, const uint8_t* src, float* dst, uint64_t n) {
  const uint64_t blocks = n / block_elements(t);  // throws for unsupported types
  (void)row_bytes(t, n);                          // throws unless n is whole blocks
  if (n == 0) return;  // callers may pass null buffers for empty ranges; memcpy must not see them
  switch (t) {
    case TensorType::F32: std::memcpy(dst, src, n * sizeof(float)); return;
    case TensorType::F16: convert_f16(src, dst, n); return;
    case TensorType::BF16: convert_bf16(src, dst, n); return;
    case TensorType::Q4_0: detail::dequant_q4_0(src, dst, blocks); return;
    case TensorType::Q4_1: detail::dequant_q4_1(src, dst, blocks); return;
    case TensorType::Q5_0: detail::dequant_q5_0(src, dst, blocks); return;
    case TensorType::Q8_0: detail::dequant_q8_0(src, dst, blocks); return;
    case TensorType::Q4_K: detail::dequant_q4_k(src, dst, blocks); return;
    case TensorType::Q5_K: detail::dequant_q5_k(src, dst, blocks); return;
    case TensorType::Q6_K: detail::dequant_q6_k(src, dst, blocks); return;
  }
  throw Error("GGUF: cannot dequantize " + type_name(t));
}

}  // namespace activekv::gguf
