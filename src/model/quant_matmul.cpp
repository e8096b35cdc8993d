// y = x · W^T over GGUF blocks (model/quant_matmul.h): the dispatch, the
// portable fused kernel, and the prefill path (dequantised row blocks + sgemm).
#include "activekv/model/quant_matmul.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "activekv/core/blas.h"
#include "activekv/core/error.h"
#include "quant_matmul_kernels.h"

namespace activekv::model {
namespace {

detail::BlockType block_type(gguf::TensorType t) {
  switch (t) {
    case gguf::TensorType::Q4_0: return detail::BlockType::q4_0;
    case gguf::TensorType::Q4_1: return detail::BlockType::q4_1;
    case gguf::TensorType::Q8_0: return detail::BlockType::q8_0;
    case gguf::TensorType::Q5_0: return detail::BlockType::q5_0;
    case gguf::TensorType::Q4_K: return detail::BlockType::q4_k;
    case gguf::TensorType::Q6_K: return detail::BlockType::q6_k;
    default: break;
  }
  throw InvalidArgument("quant_matmul: no CPU kernel for " + gguf::type_name(t) +
                        " (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K only)");
}

gguf::TensorType tensor_type(detail::BlockType t) {
  switch (t) {
    case detail::BlockType::q4_0: return gguf::TensorType::Q4_0;
    case detail::BlockType::q4_1: return gguf::TensorType::Q4_1;
    case detail::BlockType::q8_0: return gguf::TensorType::Q8_0;
    case detail::BlockType::q5_0: return gguf::TensorType::Q5_0;
    case detail::BlockType::q4_k: return gguf::TensorType::Q4_K;
    case detail::BlockType::q6_k: return gguf::TensorType::Q6_K;
  }
  return gguf::TensorType::Q8_0;
}

// The matrix's own consistency (a hand-built one; Weights::load's come from
// a validated GGUF): whole blocks a row, the bytes it needs.
void check_matrix(const QuantMatrix& w) {
  const int per_block = detail::block_elements(block_type(w.type));  // throws for a type without a kernel
  if (w.rows < 0 || w.cols <= 0 || w.cols % per_block != 0)
    throw InvalidArgument(fmt::format("quant_matmul: a {} x {} {} matrix (columns: a positive multiple of {})", w.rows,
                                      w.cols, gguf::type_name(w.type), per_block));
  if (w.blocks.size() != size_t(w.rows) * w.row_bytes())
    throw InvalidArgument(fmt::format("quant_matmul: {} bytes of blocks for {} rows of {} bytes", w.blocks.size(),
                                      w.rows, w.row_bytes()));
}

// Rows of W one task takes: enough to amortise the task, few enough that
// the threads share a 192-row K projection.
constexpr int64_t kRowsPerTask = 16;

void run_fused(const QuantMatrix& w, int n, const float* x, float* y, bool avx2) {
  const detail::FusedRows f{block_type(w.type), w.blocks.data(), w.row_bytes(), w.cols, n, x, y, w.rows};
  const int64_t tasks = (w.rows + kRowsPerTask - 1) / kRowsPerTask;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < tasks; ++i) {
    const int64_t r0 = i * kRowsPerTask, r1 = std::min(w.rows, r0 + kRowsPerTask);
    if (avx2) detail::fused_rows_avx2(f, r0, r1);
    else detail::fused_rows_portable(f, r0, r1);
  }
}

// Row blocks of about this many fp32 bytes are dequantised, then one sgemm each.
constexpr size_t kPrefillBlockBytes = size_t(16) << 20;

// The block's rows are decoded by the AVX2 kernel's decode where the CPU has
// it (the same values, tested), else by gguf::dequantize.
void run_prefill(const QuantMatrix& w, int n, const float* x, float* y, QuantScratch& s) {
  const int64_t per_block =
      std::min(w.rows, std::max<int64_t>(16, int64_t(kPrefillBlockBytes / (sizeof(float) * size_t(w.cols)))));
  s.rows.resize(size_t(per_block) * size_t(w.cols));
  const detail::FusedRows f{block_type(w.type), w.blocks.data(), w.row_bytes(), w.cols, 0, nullptr, nullptr, 0};
  const bool avx2 = cpu_has_avx2_fma();
  for (int64_t r0 = 0; r0 < w.rows; r0 += per_block) {
    const int64_t nb = std::min(per_block, w.rows - r0);
#pragma omp parallel for schedule(static)
    for (int64_t r = r0; r < r0 + nb; ++r) {
      float* out = s.rows.data() + size_t(r - r0) * size_t(w.cols);
      if (avx2) detail::dequantize_rows_avx2(f, r, r + 1, out);
      else w.dequantize_row(r, out);
    }
    gemm_nt(n, int(nb), int(w.cols), 1.0f, x, int(w.cols), s.rows.data(), int(w.cols), 0.0f, y + r0, int(w.rows));
  }
}

}  // namespace

namespace detail {

// Decodes each block with gguf::dequantize itself (the weights are the
// reference's by construction) and sums with std::fma in the lanes and tree
// that quant_matmul.h specifies, so its bits are the AVX2 kernel's.
void fused_rows_portable(const FusedRows& f, int64_t r0, int64_t r1) {
  const gguf::TensorType type = tensor_type(f.type);
  const size_t bb = block_bytes(f.type);
  const int per_block = block_elements(f.type);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = f.w + size_t(r) * f.row_bytes;
    float acc[kFusedVectors][32] = {};
    for (int64_t b = 0; b < f.cols / per_block; ++b) {
      float wb[256];
      gguf::dequantize(type, row + size_t(b) * bb, wb, uint64_t(per_block));
      for (int u = 0; u < per_block; u += 32)  // 32-element units in row order
        for (int t = 0; t < f.n; ++t) {
          const float* x = f.x + size_t(t) * size_t(f.cols) + size_t(b) * per_block + size_t(u);
          for (int e = 0; e < 32; ++e) acc[t][e] = std::fma(wb[u + e], x[e], acc[t][e]);
        }
    }
    for (int t = 0; t < f.n; ++t) {
      const float* a = acc[t];
      float s[8];
      for (int l = 0; l < 8; ++l) s[l] = (a[l] + a[8 + l]) + (a[16 + l] + a[24 + l]);
      f.y[size_t(t) * size_t(f.ldy) + size_t(r)] = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
    }
  }
}

}  // namespace detail

void QuantMatrix::dequantize_row(int64_t r, float* out) const {
  const size_t rb = row_bytes();
  gguf::dequantize(type, blocks.data() + size_t(r) * rb, out, uint64_t(cols));
}

bool quant_matmul_supports(gguf::TensorType t) {
  using gguf::TensorType;
  return t == TensorType::Q4_0 || t == TensorType::Q4_1 || t == TensorType::Q8_0 || t == TensorType::Q5_0 ||
         t == TensorType::Q4_K || t == TensorType::Q6_K;
}

bool cpu_has_avx2_fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c");
  return has;
}

void quant_matmul_fused(const QuantMatrix& w, int n, const float* x, float* y, MatmulIsa isa) {
  if (n < 0 || n > kFusedVectors)
    throw InvalidArgument(fmt::format("quant_matmul_fused: {} rows of x (0..{})", n, kFusedVectors));
  check_matrix(w);
  if (isa == MatmulIsa::avx2 && !cpu_has_avx2_fma())
    throw InvalidArgument("quant_matmul_fused: this CPU lacks AVX2, FMA or F16C");
  if (n == 0 || w.rows == 0) return;
  run_fused(w, n, x, y, isa == MatmulIsa::avx2 || (isa == MatmulIsa::automatic && cpu_has_avx2_fma()));
}

void dequantize_rows(const QuantMatrix& w, int64_t r0, int64_t r1, float* out, MatmulIsa isa) {
  check_matrix(w);
  if (isa == MatmulIsa::avx2 && !cpu_has_avx2_fma())
    throw InvalidArgument("dequantize_rows: this CPU lacks AVX2, FMA or F16C");
  if (r0 < 0 || r1 < r0 || r1 > w.rows)
    throw InvalidArgument(fmt::format("dequantize_rows: rows [{}, {}) of {}", r0, r1, w.rows));
  if (isa == MatmulIsa::avx2 || (isa == MatmulIsa::automatic && cpu_has_avx2_fma())) {
    const detail::FusedRows f{block_type(w.type), w.blocks.data(), w.row_bytes(), w.cols, 0, nullptr, nullptr, 0};
    detail::dequantize_rows_avx2(f, r0, r1, out);
    return;
  }
  for (int64_t r = r0; r < r1; ++r) w.dequantize_row(r, out + size_t(r - r0) * size_t(w.cols));
}

void quant_matmul(const QuantMatrix& w, int n, const float* x, float* y, QuantScratch& scratch) {
  if (n < 0) throw InvalidArgument(fmt::format("quant_matmul: {} rows of x", n));
  if (n <= kFusedVectors) return quant_matmul_fused(w, n, x, y, MatmulIsa::automatic);
  check_matrix(w);
  if (w.rows > 0) run_prefill(w, n, x, y, scratch);
}

}  // namespace activekv::model
