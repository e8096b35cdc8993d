// Internal: the fused dot kernels of quant_matmul.h (the arithmetic is
// specified there). quant_matmul_avx2.cpp is the only translation unit
// compiled for AVX2 (its own target pragma) and includes only this header,
// <immintrin.h> and <cstring>: no inline function built for AVX2 can be
// shared with another TU and run on a CPU without it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace activekv::model::detail {

enum class BlockType { q4_0, q4_1, q8_0 };

/// One call's work: rows [r0, r1) of W (row r at w + r * row_bytes, cols
/// elements) dotted with x rows t < n (x + t * cols), into y[t * ldy + r].
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
