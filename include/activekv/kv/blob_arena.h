// The arena of the page store that holds encoded pages (int8s, lossless13
// blobs of activekv/kv/codec.h) in the same host memory as the bf16 pages.
//
// Memory comes from the store's HostMemory in chunks (default 64 MiB, more
// for a larger blob); a blob is a 256-byte aligned range of one chunk, found
// first-fit, and its release merges it with free neighbours, so a long run
// that converts and drops pages reuses the same bytes instead of growing.
// Chunks are never moved or returned before the arena dies: a Blob's pointer
// stays valid until release(). Thread-safe (background conversion allocates
// while decode reads other blobs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "activekv/kv/host_memory.h"

namespace activekv::kv {

/// One allocated range of the arena.
struct Blob {
  std::byte* data = nullptr;
  size_t bytes = 0;  ///< as asked (the range is rounded up to 256 bytes)
};

class BlobArena {
 public:
  static constexpr size_t kAlign = 256;
  /// `limit_bytes` caps the chunks' total (0 = no cap).
  explicit BlobArena(HostMemory& memory, size_t limit_bytes = 0, size_t chunk_bytes = size_t(64) << 20);
  ~BlobArena();
  BlobArena(const BlobArena&) = delete;
  BlobArena& operator=(const BlobArena&) = delete;

  /// A range of `bytes` (> 0). Throws Error naming the sizes when the cap is
  /// reached or the memory cannot be had; the arena is unchanged then.
  Blob allocate(size_t bytes);
  /// Returns a blob from allocate(). Throws InvalidArgument for one that is
  /// not live (never allocated, or already released).
  void release(const Blob& blob);

  size_t bytes_in_use() const;    ///< rounded sizes of live blobs
  size_t bytes_reserved() const;  ///< chunks taken from the memory

 private:
  struct Range { size_t offset, bytes; };
  struct Chunk {
    std::byte* data;
    size_t bytes;
    std::vector<Range> free;  // sorted by offset, no two adjacent
  };
  static size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
  bool take(Chunk& c, size_t bytes, Blob& out);

  HostMemory* memory_;
  size_t limit_, chunk_bytes_;
  mutable std::mutex mu_;
  std::vector<Chunk> chunks_;
  std::unordered_map<const std::byte*, size_t> live_;  // blob start -> rounded size
  size_t in_use_ = 0, reserved_ = 0;
};

}  // namespace activekv::kv
