// Where the host KV history's bytes come from.
//
// The page store (page_store.h) takes its page slabs and its blob arena from
// a HostMemory. The CPU path uses plain memory; the GPU runtime passes pinned
// (page-locked) memory (cuda::PinnedHostMemory, activekv/cuda/pinned_memory.h)
// so that the very pages the model writes are the pages the engine streams
// with DMA (SPEC §7: never stream from pageable memory, ~8.7 vs ~55 GB/s).
// Whether the store is pinned is the store's memory's choice, not the caller's.
#pragma once

#include <cstddef>
#include <string>

namespace activekv::kv {

class HostMemory {
 public:
  virtual ~HostMemory() = default;
  /// Returns `bytes` (> 0) zero-filled bytes, 256-byte aligned. Throws Error
  /// naming the byte count (and the memory kind) when they cannot be had.
  virtual std::byte* allocate(size_t bytes) = 0;
  /// Returns memory from allocate() (same byte count). Never throws.
  virtual void free(std::byte* p, size_t bytes) noexcept = 0;
  /// True if the memory is page-locked and mapped for DMA by the GPU.
  virtual bool pinned() const = 0;
  /// "plain" / "pinned": for messages and summaries.
  virtual std::string name() const = 0;
};

/// Ordinary pageable memory (large blocks are zero pages the OS commits on
/// first touch; blocks from 2 MiB on are 2 MiB aligned and advised into
/// transparent huge pages, which the CPU attention kernels read faster).
/// Thread-safe; lives for the whole program.
HostMemory& plain_host_memory();

/// Bytes of memory the OS reports available (MemAvailable of /proc/meminfo),
/// or 0 if it cannot be read. For "does not fit" messages.
size_t host_memory_available();

}  // namespace activekv::kv
