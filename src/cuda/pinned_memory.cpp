#include "activekv/cuda/pinned_memory.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cstring>

#include "activekv/cuda/decode_attention.h"

namespace activekv::cuda {

std::byte* PinnedHostMemory::allocate(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable | cudaHostAllocMapped);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw CudaError(fmt::format("cannot pin {:.1f} MiB of host memory ({:.1f} MiB available): {}",
                                double(bytes) / (1 << 20), double(kv::host_memory_available()) / (1 << 20),
                                cudaGetErrorString(e)));
  }
  std::memset(p, 0, bytes);
  return static_cast<std::byte*>(p);
}

void PinnedHostMemory::free(std::byte* p, size_t) noexcept {
  if (p) cudaFreeHost(p);
}

PinnedHostMemory& pinned_host_memory() {
  static PinnedHostMemory memory;
  return memory;
}

}  // namespace activekv::cuda
