#include "activekv/core/blas.h"

#include <cblas.h>

namespace activekv {
namespace {
// Below this many rows of A, sgemm spends its time packing the large operand
// (a whole weight matrix per decode token); row-by-row sgemv streams it once
// per row instead, which is what a decode step wants.
constexpr int kGemvRows = 8;
}  // namespace

void gemm_nt(int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
             float beta, float* C, int ldc) {
  if (M <= kGemvRows) {
    for (int i = 0; i < M; ++i) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, N, K, alpha, B, ldb, A + size_t(i) * lda, 1, beta,
                  C + size_t(i) * ldc, 1);
    }
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_nn(int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
             float beta, float* C, int ldc) {
  if (M <= kGemvRows) {
    for (int i = 0; i < M; ++i) {
      cblas_sgemv(CblasRowMajor, CblasTrans, K, N, alpha, B, ldb, A + size_t(i) * lda, 1, beta,
                  C + size_t(i) * ldc, 1);
    }
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C,
              ldc);
}

void set_blas_threads(int n) { openblas_set_num_threads(n < 1 ? 1 : n); }

}  // namespace activekv
