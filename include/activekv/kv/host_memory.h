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

/// `bytes` (> 0) of zeroed anonymous memory at a 2 MiB boundary, the mapping
/// rounded up to whole 2 MiB; with `huge`, madvise(MADV_HUGEPAGE) before any
/// byte is touched, so that transparent huge pages back it where the kernel
/// allows them (THP "madvise" or "always"). On 4 KiB pages each stream the
/// CPU attention kernels read crosses a page every 4 KiB (a TLB miss, and
/// the hardware prefetcher stops at page boundaries: the likely cause -- not
/// measured with counters -- of what bench_cpu_attention --huge-pages
/// measured: bf16 history read 14-17 % faster on the dev VM,
/// bench/results/devvm_cpu_attention_hugepages_88e0efa.json). nullptr when
/// the mapping fails. Release with unmap_2mib_aligned(p, bytes).
std::byte* map_2mib_aligned(size_t bytes, bool huge);
void unmap_2mib_aligned(std::byte* p, size_t bytes) noexcept;

/// Bytes of memory the OS reports available (MemAvailable of /proc/meminfo),
/// or 0 if it cannot be read. For "does not fit" messages.
size_t host_memory_available();

}  // namespace activekv::kv
