// device_malloc and DevBuf: see device_buffer.h.
#include "device_buffer.h"

#include <cuda_runtime.h>

#include <cstdio>

#include "activekv/cuda/decode_attention.h"

namespace activekv::cuda {

void* device_malloc(size_t bytes, const std::string& what) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes < 16 ? 16 : bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    char gib[32];
    std::snprintf(gib, sizeof gib, "%.2f GiB", double(bytes) / double(size_t(1) << 30));
    throw CudaError(what + ": cudaMalloc of " + std::to_string(bytes) + " bytes (" + gib + ") failed: " +
                    cudaGetErrorString(e));
  }
  return p;
}

DevBuf::~DevBuf() {
  if (p) cudaFree(p);
}

}  // namespace activekv::cuda
