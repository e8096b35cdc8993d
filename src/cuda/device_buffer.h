// Internal to the CUDA backend: a device allocation freed on scope exit
// (also when a later call throws).
#pragma once

#include <cstddef>

namespace activekv::cuda {

/// cudaMalloc of max(bytes, 16); throws CudaError naming the size on failure.
struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(size_t bytes);
  ~DevBuf();
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <class T> T* as() const { return static_cast<T*>(p); }
};

}  // namespace activekv::cuda
