// Prefill GEMM on GGUF-typed weights through cuBLAS:
//
//   Y[t][r] = (accumulate ? Y[t][r] : 0) + sum_c W[r][c] * X[t][c]
//
// X fp32 [n_tokens][cols] is rounded to bf16 into scratch; W (a DeviceMatrix,
// quant_matvec.h) is dequantised to bf16 into scratch in tiles of rows (the
// whole matrix when it fits the weight scratch); each tile is one
// cublasGemmEx with bf16 inputs, fp32 compute and fp32 output Y [n_tokens][rows]
// (beta = 1 when accumulating). bf16 rounding of both inputs is the only
// error beyond fp32 summation: |dY| <~ 2^-8 * sum_c |W[r][c] X[t][c]|.
//
// Scratch (device memory, allocated once by the constructor and bounded):
//   X:   max_tokens * max_cols * 2 bytes
//   W:   weight_scratch_bytes; a tile is floor(weight_scratch_bytes / (2 * cols))
//        rows (a multiple of 64 when more than 64), e.g. a 32000 x 5120 head is
//        328 MB in bf16: two tiles with the default 256 MiB.
//   cuBLAS workspace: cublas_workspace_bytes.
// Not thread-safe; successive calls reuse the scratch, so they must be
// ordered: one stream, or the caller synchronises between streams.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "activekv/cuda/quant_matvec.h"

namespace activekv::cuda {

/// A failed cuBLAS call: the message names the call and the status
/// (e.g. "cublasGemmEx: CUBLAS_STATUS_INVALID_VALUE (...)").
void check_cublas(int status, const char* what);

class WeightGemm {
 public:
  struct Options {
    int64_t max_tokens = 2048;                      ///< largest n_tokens of a call
    int64_t max_cols = 32768;                       ///< largest W cols (= X row length)
    size_t weight_scratch_bytes = size_t(256) << 20;  ///< bf16 W tile scratch
    size_t cublas_workspace_bytes = size_t(32) << 20;
  };

  /// Creates the cuBLAS handle and allocates the scratch on the current
  /// device. Throws InvalidArgument for non-positive sizes, CudaError if the
  /// allocation or cuBLAS initialisation fails.
  explicit WeightGemm(const Options& opt);
  WeightGemm();
  ~WeightGemm();
  WeightGemm(const WeightGemm&) = delete;
  WeightGemm& operator=(const WeightGemm&) = delete;

  /// Y (device fp32 [n_tokens][w.rows]) as above, x device fp32
  /// [n_tokens][w.cols]. n_tokens == 0 or w.rows == 0 is a no-op. Throws
  /// InvalidArgument for a bad matrix (validate_matrix), n_tokens outside
  /// [0, max_tokens], cols > max_cols or null pointers; CudaError for CUDA or
  /// cuBLAS failures.
  void run(const DeviceMatrix& w, const float* x, int64_t n_tokens, float* y, bool accumulate,
           cudaStream_t stream);

  /// Rows of `w` dequantised per cuBLAS call (w.rows when the whole matrix fits).
  int64_t tile_rows(const DeviceMatrix& w) const;

  const Options& options() const { return opt_; }

 private:
  struct Impl;
  Options opt_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace activekv::cuda
