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

class PlainHostMemory final : public HostMemory {
  static constexpr size_t kMapBytes = size_t(1) << 16;

 public:
  std::byte* allocate(size_t bytes) override {
    // Large blocks: anonymous mmap -- page aligned, zero pages the OS commits
    // on first touch, so a store sized for a long context costs nothing until
    // it is written. Small ones: aligned_alloc + memset.
    // More than the machine has would only fail later, page by page, at the
    // OOM killer's hands: refuse it now, with the numbers.
    const size_t available = host_memory_available();
    void* p = nullptr;
    if (available != 0 && bytes > available) {
      p = nullptr;
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
    if (bytes >= kMapBytes) {
      munmap(p, bytes);
    } else {
      std::free(p);
    }
  }
  bool pinned() const override { return false; }
  std::string name() const override { return "plain"; }
};

}  // namespace

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
