// Internal: the fused dot kernels of quant_matmul.h (the arithmetic is
// specified there). quant_matmul_avx2.cpp is the only translation unit
// compiled for AVX2 (its own target pragma) and includes only this header,
// <immintrin.h> and <cstring>: no inline function built for AVX2 can be
// shared with another TU and run on a CPU without it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace activekv::model::detail {

enum class BlockType { q4_0, q4_1, q8_0, q5_0, q4_k, q6_k };

/// Bytes of one GGUF block and the elements it holds (32, or 256 for the
/// K-quants' super-blocks; layouts in gguf/tensor_type.h). The kernels work
/// in units of 32 elements: unit u of a row is block u of it, or for a
/// K-quant sub-block u % 8 of super-block u / 8.
constexpr size_t block_bytes(BlockType t) {
  switch (t) {
    case BlockType::q4_0: return 18;
    case BlockType::q4_1: return 20;
    case BlockType::q8_0: return 34;
    case BlockType::q5_0: return 22;
    case BlockType::q4_k: return 144;
    case BlockType::q6_k: return 210;
  }
  return 0;
}
constexpr int block_elements(BlockType t) { return t == BlockType::q4_k || t == BlockType::q6_k ? 256 : 32; }

/// One call's work: rows [r0, r1) of W (row r at w + r * row_bytes, cols
/// elements, a multiple of block_elements(type)) dotted with x rows t < n
/// (x + t * cols), into y[t * ldy + r].
struct FusedRows {
  BlockType type;
  const uint8_t* w;
  size_t row_bytes;
  int64_t cols;
  int n;
  const float* x;
  float* y;
  int64_t ldy;
};

void fused_rows_avx2(const FusedRows& f, int64_t r0, int64_t r1);
void fused_rows_portable(const FusedRows& f, int64_t r0, int64_t r1);
/// Rows [r0, r1) of W in fp32 (gguf::dequantize's values) into out[(r - r0) * cols + c]; f.n, f.x, f.y unused.
void dequantize_rows_avx2(const FusedRows& f, int64_t r0, int64_t r1, float* out);

}  // namespace activekv::model::detail
