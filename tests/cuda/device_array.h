// Test helpers of the model-op and sampler GPU tests: a typed device array
// (allocation, upload, download, poison; every CUDA call checked) and the
// skip-without-GPU guard.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace activekv::cuda::testing {

inline void ck(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw std::runtime_error(what + ": " + cudaGetErrorString(e));
}

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

/// n elements of T in device memory, freed on scope exit.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    ck(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc of " + std::to_string(n * sizeof(T)) + " bytes");
  }
  explicit DeviceArray(const std::vector<T>& v) : DeviceArray(v.size()) { upload(v); }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return p_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& v) {
    if (v.size() != n_) throw std::runtime_error("DeviceArray::upload: size mismatch");
    ck(cudaMemcpy(p_, v.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    ck(cudaDeviceSynchronize(), "cudaDeviceSynchronize after H2D");  // pageable H2D may return before the DMA ends
  }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    ck(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return v;
  }
  /// Every byte 0xFF: NaN for floats, -1 for integers -- what a kernel that
  /// skips an output leaves behind.
  void poison() {
    ck(cudaMemset(p_, 0xFF, std::max<size_t>(n_, 1) * sizeof(T)), "cudaMemset");
    ck(cudaDeviceSynchronize(), "cudaDeviceSynchronize after cudaMemset");
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

/// A non-default stream (the ops must honour it), synchronised by sync().
class Stream {
 public:
  Stream() { ck(cudaStreamCreate(&s_), "cudaStreamCreate"); }
  ~Stream() { cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  void sync() const { ck(cudaStreamSynchronize(s_), "cudaStreamSynchronize (kernel error?)"); }

 private:
  cudaStream_t s_ = nullptr;
};

}  // namespace activekv::cuda::testing

#define AKV_NEED_GPU() \
  if (!::activekv::cuda::testing::have_gpu()) GTEST_SKIP() << "no CUDA device"
