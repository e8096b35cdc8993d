// Pinned host memory for the page store (activekv/kv/host_memory.h): the
// pages the model writes are the pages the engine streams with DMA.
#pragma once

#include "activekv/kv/host_memory.h"

namespace activekv::cuda {

/// Page-locked host memory, portable (every context) and mapped (a kernel
/// may write it directly: the runtime writes each new token's K/V into its
/// host page this way; the device address is the host address). Blocks from
/// 2 MiB on are mapped 2 MiB-aligned with MADV_HUGEPAGE, zeroed (so that
/// transparent huge pages back them where the kernel allows) and then
/// registered (cudaHostRegister): the host CPU reads pages it attends
/// (co-attention) across fewer TLB entries, as kv::plain_host_memory's
/// blocks. Smaller blocks, and every block where a GPU cannot use a
/// registered block's host address (cudaDevAttrCanUseHostPointerForRegisteredMem)
/// or with ACTIVEKV_PINNED_HUGE_PAGES=0: cudaHostAlloc. Zero-filled on
/// allocation. Throws CudaError naming the bytes asked and the host memory
/// available when the memory cannot be pinned. Thread-safe.
class PinnedHostMemory final : public kv::HostMemory {
 public:
  /// Whether blocks from 2 MiB on take the huge-page path (fixed per process).
  static bool huge_pages();
  std::byte* allocate(size_t bytes) override;
  void free(std::byte* p, size_t bytes) noexcept override;
  bool pinned() const override { return true; }
  std::string name() const override { return "pinned"; }
};

/// The one instance (the memory has no state of its own).
PinnedHostMemory& pinned_host_memory();

}  // namespace activekv::cuda
