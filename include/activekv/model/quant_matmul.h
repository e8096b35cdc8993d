// y = x · W^T on the CPU with W kept in its GGUF blocks: the CPU model's
// weights without an fp32 copy. A decode step then reads the blocks (Q4_1:
// 5 bits a weight, Q8_0: 8.5, Q4_K 4.5, Q6_K 6.6) instead of 32 bits a weight.
//
// Types: Q4_0, Q4_1, Q5_0 and Q8_0 (32-element blocks: an fp16 scale d, Q4_1
// an fp16 minimum m, Q5_0 the codes' fifth bits, then the codes), Q4_K and
// Q6_K (256-element super-blocks of 8 sub-blocks with their own scales);
// layouts in gguf/tensor_type.h. Other types stay dequantised to fp32 at load
// (model/weights.h).
//
// Arithmetic. Every weight is the fp32 value gguf::dequantize gives (the same
// expression and rounding: Q4_0 (q - 8) * d, Q4_1 q * d + m, Q5_0 (q - 16) * d,
// Q8_0 q * d, Q4_K (d * sc) * q - dmin * m, Q6_K (d * sc) * (q - 32)).
//  - Up to kFusedVectors rows of x (decode, a server's batch): each dot of a
//    W row with an x row is summed in 4 x 8 fp32 lanes, lane l of quarter k
//    taking elements 32 b + 8 k + l of every 32-element unit b by a fused multiply-add,
//    then s_l = (q0_l + q1_l) + (q2_l + q3_l) and the dot is
//    ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)). One thread computes a
//    dot whole, so the bits do not depend on the thread count, on how many
//    x rows are multiplied together, or on the ISA: the AVX2 kernel and the
//    portable one (std::fma) give the same bits (tested; for finite scales:
//    the AVX2 conversion quiets a signalling-NaN scale, gguf's keeps it).
//  - More rows (prefill): row blocks of W are dequantised into scratch and
//    multiplied by OpenBLAS sgemm, as the fp32 weights were.
// Against the fp32 weights through sgemm the fused dots differ in rounding
// only: another summation order, and fused multiply-adds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "activekv/gguf/tensor_type.h"

namespace activekv::model {

/// Rows of x up to which quant_matmul takes the fused kernel.
constexpr int kFusedVectors = 16;

/// A matrix [rows][cols] of one block type, row-major: row r is
/// row_bytes() bytes of blocks at blocks.data() + r * row_bytes().
struct QuantMatrix {
  gguf::TensorType type = gguf::TensorType::Q8_0;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> blocks;

  size_t row_bytes() const { return gguf::row_bytes(type, uint64_t(cols)); }
  /// Row r in fp32 (gguf::dequantize of its blocks) into out[cols].
  void dequantize_row(int64_t r, float* out) const;
};

/// True for the block types quant_matmul computes: Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K.
bool quant_matmul_supports(gguf::TensorType t);

/// Scratch of the prefill path (dequantised row blocks); reused across calls.
struct QuantScratch {
  std::vector<float> rows;
};

/// y[t][r] = sum_c x[t][c] * W[r][c] for t < n, r < w.rows: x is [n][cols],
/// y is [n][rows] (row-major, dense). OpenMP threads over the rows of W
/// (omp_get_max_threads()). Throws InvalidArgument for an unsupported type,
/// n < 0, cols not a positive multiple of the type's block (32, K-quants 256), or blocks not rows x
/// row_bytes() long -- before any work.
void quant_matmul(const QuantMatrix& w, int n, const float* x, float* y, QuantScratch& scratch);

/// The fused kernels, for tests and benchmarks: n <= kFusedVectors.
enum class MatmulIsa { automatic, avx2, portable };
/// True if this CPU has AVX2, FMA and F16C (the AVX2 kernel's).
bool cpu_has_avx2_fma();
/// Rows [r0, r1) of W in fp32 into out[(r - r0) * cols + c]: the prefill
/// path's decode (AVX2 where chosen, else gguf::dequantize; the same values).
/// Throws as quant_matmul_fused for a bad matrix or ISA, InvalidArgument for
/// rows outside [0, w.rows].
void dequantize_rows(const QuantMatrix& w, int64_t r0, int64_t r1, float* out, MatmulIsa isa);
/// quant_matmul's fused path with the ISA chosen. Throws InvalidArgument for
/// n outside 0..kFusedVectors, an unsupported type, or avx2 on a CPU
/// without it.
void quant_matmul_fused(const QuantMatrix& w, int n, const float* x, float* y, MatmulIsa isa);

}  // namespace activekv::model
