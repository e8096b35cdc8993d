#include "activekv/core/blas.h"

#include <cblas.h>

#include <algorithm>
#include <cctype>
#include <iterator>

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

std::string blas_core_name() {
  const char* name = openblas_get_corename();
  return name ? name : "";
}

std::string blas_coretype_fix() {
  std::string core = blas_core_name();
  for (char& c : core) c = char(std::tolower(static_cast<unsigned char>(c)));
  static const char* const kPreAvx[] = {"prescott", "core2", "penryn", "dunnington", "nehalem", "atom",
                                         "banias", "katmai", "coppermine", "northwood"};
  const bool generic = std::find(std::begin(kPreAvx), std::end(kPreAvx), core) != std::end(kPreAvx);
  if (!generic) return "";
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return "";
}

}  // namespace activekv
