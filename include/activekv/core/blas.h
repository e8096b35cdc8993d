// Thin wrappers over OpenBLAS (row-major, fp32) so that only one file
// includes cblas.h. All matrices are row-major; ld* are row strides in elements.
#pragma once

namespace activekv {

/// C[M][N] = alpha * A[M][K] · B[N][K]^T + beta * C   (B given row-major as [N][K]).
void gemm_nt(int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
             float beta, float* C, int ldc);
/// C[M][N] = alpha * A[M][K] · B[K][N] + beta * C.
void gemm_nn(int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
             float beta, float* C, int ldc);
/// Sets the number of threads OpenBLAS may use (>= 1).
void set_blas_threads(int n);

}  // namespace activekv
