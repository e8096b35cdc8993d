#include "activekv/kv/blob_arena.h"

#include <fmt/format.h>

#include <algorithm>

#include "activekv/core/error.h"

namespace activekv::kv {

BlobArena::BlobArena(HostMemory& memory, size_t limit_bytes, size_t chunk_bytes)
    : memory_(&memory), limit_(limit_bytes), chunk_bytes_(round_up(std::max<size_t>(chunk_bytes, kAlign))) {}

BlobArena::~BlobArena() {
  for (Chunk& c : chunks_) memory_->free(c.data, c.bytes);
}

// First fit inside one chunk; splits the free range it takes from.
bool BlobArena::take(Chunk& c, size_t bytes, Blob& out) {
  const size_t need = round_up(bytes);
  for (size_t i = 0; i < c.free.size(); ++i) {
    Range& r = c.free[i];
    if (r.bytes < need) continue;
    out = Blob{c.data + r.offset, bytes};
    r.offset += need;
    r.bytes -= need;
    if (r.bytes == 0) c.free.erase(c.free.begin() + std::ptrdiff_t(i));
    in_use_ += need;
    live_.emplace(out.data, need);
    return true;
  }
  return false;
}

Blob BlobArena::allocate(size_t bytes) {
  if (bytes == 0) throw InvalidArgument("BlobArena::allocate: zero bytes");
  std::lock_guard<std::mutex> lock(mu_);
  Blob out;
  for (Chunk& c : chunks_)
    if (take(c, bytes, out)) return out;
  const size_t size = std::max(chunk_bytes_, round_up(bytes));
  if (limit_ != 0 && reserved_ + size > limit_) {
    throw Error(fmt::format("encoded-page arena full: {} bytes asked, {} of {} bytes in use", bytes, in_use_, limit_));
  }
  Chunk c{memory_->allocate(size), size, {Range{0, size}}};  // throws with the sizes
  chunks_.push_back(std::move(c));
  reserved_ += size;
  take(chunks_.back(), bytes, out);
  return out;
}

void BlobArena::release(const Blob& blob) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto live = live_.find(blob.data);
  if (live == live_.end() || live->second != round_up(blob.bytes)) {
    throw InvalidArgument("BlobArena::release: the blob is not live in this arena (never allocated or already released)");
  }
  const size_t need = live->second;
  for (Chunk& c : chunks_) {
    if (blob.data < c.data || blob.data >= c.data + c.bytes) continue;
    const size_t off = size_t(blob.data - c.data);
    auto it = std::lower_bound(c.free.begin(), c.free.end(), off,
                               [](const Range& r, size_t o) { return r.offset < o; });
    it = c.free.insert(it, Range{off, need});
    if (std::next(it) != c.free.end() && it->offset + it->bytes == std::next(it)->offset) {
      it->bytes += std::next(it)->bytes;
      c.free.erase(std::next(it));
    }
    if (it != c.free.begin() && std::prev(it)->offset + std::prev(it)->bytes == it->offset) {
      std::prev(it)->bytes += it->bytes;
      c.free.erase(it);
    }
    in_use_ -= need;
    live_.erase(live);
    return;
  }
}

size_t BlobArena::bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}

size_t BlobArena::bytes_reserved() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reserved_;
}

}  // namespace activekv::kv
