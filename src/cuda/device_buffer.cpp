// DevBuf: see device_buffer.h.
#include "device_buffer.h"

#include <cuda_runtime.h>

#include <string>

#include "activekv/cuda/decode_attention.h"

namespace activekv::cuda {

DevBuf::DevBuf(size_t bytes) {
  const cudaError_t e = cudaMalloc(&p, bytes < 16 ? 16 : bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw CudaError("cudaMalloc of " + std::to_string(bytes) + " bytes failed: " + cudaGetErrorString(e));
  }
}
DevBuf::~DevBuf() {
  if (p) cudaFree(p);
}

}  // namespace activekv::cuda
