// File mapping. mmap keeps multi-GB models out of the heap and lets the
// kernel page tensor data in on demand.
#include "mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "activekv/core/error.h"

namespace activekv::gguf::detail {

namespace {
[[noreturn]] void sys_fail(const std::string& what, const std::string& path, int err) {
  throw Error("GGUF: cannot " + what + " '" + path + "': " + std::strerror(err));
}
}  // namespace

Mapping::Mapping(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) sys_fail("open", path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    sys_fail("stat", path, err);
  }
  if (!S_ISREG(st.st_mode) || st.st_size <= 0) {
    ::close(fd);
    throw Error("GGUF: '" + path + "' is empty or not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  void* addr = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file referenced
  if (addr == MAP_FAILED) sys_fail("mmap", path, err);
  addr_ = addr;
}

Mapping::Mapping(Mapping&& other) noexcept
    : addr_(std::exchange(other.addr_, nullptr)), size_(std::exchange(other.size_, 0)) {}

Mapping& Mapping::operator=(Mapping&& other) noexcept {
  if (this != &other) {
    release();
    addr_ = std::exchange(other.addr_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

Mapping::~Mapping() { release(); }

void Mapping::release() noexcept {
  if (addr_ != nullptr) ::munmap(addr_, size_);
  addr_ = nullptr;
  size_ = 0;
}

}  // namespace activekv::gguf::detail
