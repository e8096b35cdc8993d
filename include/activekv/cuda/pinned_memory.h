// Pinned host memory for the page store (activekv/kv/host_memory.h): the
// pages the model writes are the pages the engine streams with DMA.
#pragma once

#include "activekv/kv/host_memory.h"

namespace activekv::cuda {

/// cudaHostAlloc'ed memory, page-locked, portable (every context) and mapped
/// (a kernel may write it directly: the runtime writes each new token's K/V
/// into its host page this way). Zero-filled on allocation. Throws
/// CudaError naming the bytes asked and the host memory available when the
/// memory cannot be pinned. Thread-safe.
class PinnedHostMemory final : public kv::HostMemory {
 public:
  std::byte* allocate(size_t bytes) override;
  void free(std::byte* p, size_t bytes) noexcept override;
  bool pinned() const override { return true; }
  std::string name() const override { return "pinned"; }
};

/// The one instance (the memory has no state of its own).
PinnedHostMemory& pinned_host_memory();

}  // namespace activekv::cuda
