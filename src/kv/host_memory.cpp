#include "activekv/kv/host_memory.h"

#include <fmt/format.h>

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "activekv/core/error.h"

namespace activekv::kv {
namespace {

/// Huge-page granularity of large blocks (x86-64 transparent huge pages).
constexpr size_t kHugeBytes = size_t(2) << 20;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

class PlainHostMemory final : public HostMemory {
  static constexpr size_t kMapBytes = size_t(1) << 16;

 public:
  std::byte* allocate(size_t bytes) override {
    // Large blocks: anonymous mmap -- page aligned, zero pages the OS commits
    // on first touch, so a store sized for a long context costs nothing until
    // it is written (from 2 MiB on, in huge pages: map_2mib_aligned; a
    // touch then commits 2 MiB). Small ones: aligned_alloc + memset.
    // More than the machine has would only fail later, page by page, at the
    // OOM killer's hands: refuse it now, with the numbers.
    const size_t available = host_memory_available();
    void* p = nullptr;
    if (available != 0 && bytes > available) {
      p = nullptr;
    } else if (bytes >= kHugeBytes) {
      p = map_2mib_aligned(bytes, /*huge=*/true);
    } else if (bytes >= kMapBytes) {
      p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) p = nullptr;
    } else if (bytes > 0) {
      p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
      if (p) std::memset(p, 0, bytes);
    }
    if (!p) {
      throw Error(fmt::format("cannot allocate {:.1f} MiB of host memory ({:.1f} MiB available)",
                              double(bytes) / (1 << 20), double(available) / (1 << 20)));
    }
    return static_cast<std::byte*>(p);
  }
  void free(std::byte* p, size_t bytes) noexcept override {
    if (bytes >= kHugeBytes) {
      unmap_2mib_aligned(p, bytes);
    } else if (bytes >= kMapBytes) {
      munmap(p, bytes);
    } else {
      std::free(p);
    }
  }
  bool pinned() const override { return false; }
  std::string name() const override { return "plain"; }
};

}  // namespace

std::byte* map_2mib_aligned(size_t bytes, bool huge) {
  const size_t mapped = round_up(bytes, kHugeBytes), span = mapped + kHugeBytes;
  void* p = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  auto* base = static_cast<std::byte*>(p);
  std::byte* aligned = base + (kHugeBytes - reinterpret_cast<uintptr_t>(base) % kHugeBytes) % kHugeBytes;
  // Trim the unaligned head and the tail: unmap_2mib_aligned unmaps exactly [aligned, + mapped).
  if (aligned > base) munmap(base, size_t(aligned - base));
  if (base + span > aligned + mapped) munmap(aligned + mapped, size_t(base + span - (aligned + mapped)));
  if (huge) madvise(aligned, mapped, MADV_HUGEPAGE);  // advice: where THP is off it changes nothing
  return aligned;
}

void unmap_2mib_aligned(std::byte* p, size_t bytes) noexcept {
  if (p) munmap(p, round_up(bytes, kHugeBytes));
}

HostMemory& plain_host_memory() {
  static PlainHostMemory memory;
  return memory;
}

size_t host_memory_available() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream s(line);
    std::string key;
    std::string unit;
    size_t kib = 0;
    if (s >> key >> kib >> unit && key == "MemAvailable:" && unit == "kB") return kib * 1024;
  }
  return 0;
}

}  // namespace activekv::kv
