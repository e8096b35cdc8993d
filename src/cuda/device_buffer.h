// Internal to the CUDA backend and the GPU bench: device allocations that
// throw a CudaError naming what was asked for when cudaMalloc fails.
#pragma once

#include <cstddef>
#include <string>

namespace activekv::cuda {

/// cudaMalloc of max(bytes, 16) on the current device. Throws CudaError
/// "<what>: cudaMalloc of <bytes> bytes (<GiB>) failed: <cuda error>" (and
/// clears the error, so later calls are not blamed for it).
void* device_malloc(size_t bytes, const std::string& what);

/// device_malloc of `count` elements of T.
template <class T>
T* device_alloc(size_t count, const std::string& what) {
  return static_cast<T*>(device_malloc(count * sizeof(T), what));
}

/// A device_malloc freed on scope exit (also when a later call throws).
struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(size_t bytes, const std::string& what = "device buffer") : p(device_malloc(bytes, what)) {}
  ~DevBuf();
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <class T> T* as() const { return static_cast<T*>(p); }
};

}  // namespace activekv::cuda
