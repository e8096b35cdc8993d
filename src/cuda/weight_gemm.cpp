// WeightGemm: bf16 cuBLAS GEMM over dequantised weight tiles (weight_gemm.h).
#include "activekv/cuda/weight_gemm.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "activekv/core/error.h"
#include "device_buffer.h"

namespace activekv::cuda {

void check_cublas(int status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    const auto s = static_cast<cublasStatus_t>(status);
    throw CudaError(std::string(what) + ": " + cublasGetStatusName(s) + " (" + cublasGetStatusString(s) + ")");
  }
}

struct WeightGemm::Impl {
  cublasHandle_t handle = nullptr;
  DevBuf x_bf16, w_bf16, workspace;
  Impl(const Options& o)
      : x_bf16(size_t(o.max_tokens) * size_t(o.max_cols) * 2),
        w_bf16(o.weight_scratch_bytes),
        workspace(o.cublas_workspace_bytes) {
    check_cublas(cublasCreate(&handle), "cublasCreate");
  }
  ~Impl() {
    if (handle) cublasDestroy(handle);
  }
};

namespace {

WeightGemm::Options checked(const WeightGemm::Options& o) {
  if (o.max_tokens <= 0 || o.max_cols <= 0 || o.weight_scratch_bytes == 0) {
    throw InvalidArgument("WeightGemm: max_tokens, max_cols and weight_scratch_bytes must be positive");
  }
  return o;
}

}  // namespace

WeightGemm::WeightGemm(const Options& opt) : opt_(checked(opt)), impl_(std::make_unique<Impl>(opt_)) {}
WeightGemm::WeightGemm() : WeightGemm(Options{}) {}
WeightGemm::~WeightGemm() = default;

int64_t WeightGemm::tile_rows(const DeviceMatrix& w) const {
  const int64_t fit = int64_t(opt_.weight_scratch_bytes / (size_t(w.cols) * 2));
  if (fit >= w.rows) return w.rows;
  return fit > 64 ? fit / 64 * 64 : fit;  // whole 64-row tiles suit the GEMM kernels
}

void WeightGemm::run(const DeviceMatrix& w, const float* x, int64_t n_tokens, float* y, bool accumulate,
                     cudaStream_t stream) {
  validate_matrix(w);
  const std::string what = "WeightGemm on " + gguf::type_name(w.type) + " " + std::to_string(w.rows) + " x " +
                           std::to_string(w.cols);
  if (n_tokens < 0 || n_tokens > opt_.max_tokens) {
    throw InvalidArgument(what + ": n_tokens " + std::to_string(n_tokens) + " outside [0, max_tokens " +
                          std::to_string(opt_.max_tokens) + "]");
  }
  if (w.cols > opt_.max_cols) {
    throw InvalidArgument(what + ": cols exceed max_cols " + std::to_string(opt_.max_cols));
  }
  if (w.rows > INT32_MAX) throw InvalidArgument(what + ": more rows than cuBLAS takes");
  if (n_tokens == 0 || w.rows == 0) return;
  if (x == nullptr || y == nullptr) throw InvalidArgument(what + ": x or y is null");
  const int64_t tile = tile_rows(w);
  if (tile < 1) {
    throw InvalidArgument(what + ": weight_scratch_bytes " + std::to_string(opt_.weight_scratch_bytes) +
                          " holds no bf16 row of " + std::to_string(w.cols) + " columns");
  }
  launch_f32_to_bf16(x, n_tokens * w.cols, impl_->x_bf16.p, stream);
  check_cublas(cublasSetStream(impl_->handle, stream), "cublasSetStream");
  // cublasSetStream resets the workspace to cuBLAS's own pool: set ours after it.
  check_cublas(cublasSetWorkspace(impl_->handle, impl_->workspace.p, opt_.cublas_workspace_bytes),
               "cublasSetWorkspace");
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
  // Column-major view: Y^T (rows x T, ld rows) = W_tile^T-of-col-major (cols x tile, ld cols)^T * X^T (cols x T).
  for (int64_t r0 = 0; r0 < w.rows; r0 += tile) {
    const int64_t nr = std::min(tile, w.rows - r0);
    launch_dequantize_bf16(w, r0, nr, impl_->w_bf16.p, stream);
    check_cublas(cublasGemmEx(impl_->handle, CUBLAS_OP_T, CUBLAS_OP_N, int(nr), int(n_tokens), int(w.cols), &alpha,
                              impl_->w_bf16.p, CUDA_R_16BF, int(w.cols), impl_->x_bf16.p, CUDA_R_16BF,
                              int(w.cols), &beta, y + r0, CUDA_R_32F, int(w.rows), CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
  }
}

}  // namespace activekv::cuda
