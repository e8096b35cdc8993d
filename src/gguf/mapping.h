// Internal: a read-only memory mapping of a whole file (RAII).
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace activekv::gguf::detail {

/// open/fstat/mmap on construction, munmap on destruction. Move-only.
class Mapping {
 public:
  /// Throws Error if the file cannot be opened or mapped, or is empty.
  explicit Mapping(const std::string& path);
  Mapping(Mapping&& other) noexcept;
  Mapping& operator=(Mapping&& other) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping();

  std::span<const uint8_t> bytes() const { return {static_cast<const uint8_t*>(addr_), size_}; }

 private:
  void release() noexcept;
  void* addr_ = nullptr;
  size_t size_ = 0;
};

}  // namespace activekv::gguf::detail
