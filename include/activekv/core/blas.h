// Thin wrappers over OpenBLAS (row-major, fp32) so that only one file
// includes cblas.h. All matrices are row-major; ld* are row strides in elements.
#pragma once

#include <string>

namespace activekv {

/// C[M][N] = alpha * A[M][K] · B[N][K]^T + beta * C   (B given row-major as [N][K]).
void gemm_nt(int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
             float beta, float* C, int ldc);
/// C[M][N] = alpha * A[M][K] · B[K][N] + beta * C.
void gemm_nn(int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
             float beta, float* C, int ldc);
/// Sets the number of threads OpenBLAS may use (>= 1).
void set_blas_threads(int n);

/// The OpenBLAS kernel family this process runs ("SkylakeX", "Haswell", ...).
std::string blas_core_name();

/// The OPENBLAS_CORETYPE to force when OpenBLAS's own CPU detection fell back
/// to a pre-AVX family on a CPU that has AVX-512 ("SkylakeX") or AVX2 + FMA
/// ("Haswell"); empty when there is nothing to fix. Seen on a VM whose CPU
/// model reads "Intel(R) Xeon(R) Processor": OpenBLAS 0.3.21 chose Prescott
/// and prefill of the default model ran at 195 instead of 516 tokens/s.
/// OpenBLAS reads the variable when it loads, so the caller re-executes.
std::string blas_coretype_fix();

}  // namespace activekv
