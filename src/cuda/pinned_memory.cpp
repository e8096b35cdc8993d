#include "activekv/cuda/pinned_memory.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "activekv/cuda/decode_attention.h"

namespace activekv::cuda {
namespace {

constexpr size_t kHugeBytes = size_t(2) << 20;

// Whether blocks from 2 MiB on are pinned on 2 MiB pages (PinnedHostMemory
// says why). Decided once per process, so that free() knows how a block was
// made: off with ACTIVEKV_PINNED_HUGE_PAGES=0, and off where a GPU cannot
// use a registered block's host address as its device address (the K/V
// write and the co-attention's partials rely on one address for both).
bool huge_pinned() {
  static const bool on = [] {
    if (const char* e = std::getenv("ACTIVEKV_PINNED_HUGE_PAGES"); e && std::string(e) == "0") return false;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      cudaGetLastError();
      return false;
    }
    for (int d = 0; d < n; ++d) {
      int same = 0;
      if (cudaDeviceGetAttribute(&same, cudaDevAttrCanUseHostPointerForRegisteredMem, d) != cudaSuccess) {
        cudaGetLastError();
        return false;
      }
      if (!same) return false;
    }
    return true;
  }();
  return on;
}

[[noreturn]] void cannot_pin(size_t bytes, const char* why) {
  throw CudaError(fmt::format("cannot pin {:.1f} MiB of host memory ({:.1f} MiB available): {}",
                              double(bytes) / (1 << 20), double(kv::host_memory_available()) / (1 << 20), why));
}

}  // namespace

bool PinnedHostMemory::huge_pages() { return huge_pinned(); }

std::byte* PinnedHostMemory::allocate(size_t bytes) {
  if (bytes >= kHugeBytes && huge_pinned()) {
    // Touched (zeroed) before it is pinned, so that the first touch takes
    // 2 MiB pages where transparent huge pages allow it (madvise or always).
    std::byte* p = kv::map_2mib_aligned(bytes, /*huge=*/true);
    if (!p) cannot_pin(bytes, "mmap failed");
    std::memset(p, 0, bytes);
    const cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
    if (e != cudaSuccess) {
      cudaGetLastError();
      kv::unmap_2mib_aligned(p, bytes);
      cannot_pin(bytes, cudaGetErrorString(e));
    }
    return p;
  }
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable | cudaHostAllocMapped);
  if (e != cudaSuccess) {
    cudaGetLastError();
    cannot_pin(bytes, cudaGetErrorString(e));
  }
  std::memset(p, 0, bytes);
  return static_cast<std::byte*>(p);
}

void PinnedHostMemory::free(std::byte* p, size_t bytes) noexcept {
  if (!p) return;
  if (bytes >= kHugeBytes && huge_pinned()) {
    cudaHostUnregister(p);
    kv::unmap_2mib_aligned(p, bytes);
  } else {
    cudaFreeHost(p);
  }
}

PinnedHostMemory& pinned_host_memory() {
  static PinnedHostMemory memory;
  return memory;
}

}  // namespace activekv::cuda
