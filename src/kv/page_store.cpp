#include "activekv/kv/page_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <new>

namespace activekv::kv {

void KvShape::validate() const {
  auto check = [](int v, const char* name) {
    if (v <= 0) throw InvalidArgument(fmt::format("KvShape: {} must be positive, got {}", name, v));
  };
  check(n_layers, "n_layers");
  check(n_kv_heads, "n_kv_heads");
  check(head_dim, "head_dim");
  check(page_size, "page_size");
}

PageStore::PageStore(const KvShape& shape, size_t max_pages) : shape_(shape), max_pages_(max_pages) {
  shape_.validate();
}

PageId PageStore::allocate() {
  if (!free_.empty()) {
    PageId id = free_.back();
    std::fill_n(pages_[id].get(), shape_.page_bytes(), std::byte{0});
    free_.pop_back();
    live_[id] = true;
    return id;
  }
  if (max_pages_ != 0 && pages_.size() >= max_pages_) {
    throw Error(fmt::format("PageStore: out of pages ({} pages of {} bytes in use, limit {})",
                            pages_in_use(), shape_.page_bytes(), max_pages_));
  }
  std::unique_ptr<std::byte[]> page(new (std::nothrow) std::byte[shape_.page_bytes()]());
  if (!page) {
    throw Error(fmt::format("PageStore: cannot allocate a page of {} bytes ({} pages in use)",
                            shape_.page_bytes(), pages_in_use()));
  }
  pages_.push_back(std::move(page));
  live_.push_back(true);
  return PageId(pages_.size() - 1);
}

void PageStore::release(PageId id) {
  if (id >= pages_.size() || !live_[id]) {
    throw InvalidArgument(fmt::format("PageStore::release: page {} is not allocated", id));
  }
  live_[id] = false;
  free_.push_back(id);
}

std::byte* PageStore::page(PageId id) const {
  if (id >= pages_.size() || !live_[id]) {
    throw InvalidArgument(fmt::format("PageStore: page {} is not allocated", id));
  }
  return pages_[id].get();
}

std::byte* PageStore::k_plane(PageId id, int kv_head) {
  return page(id) + size_t(kv_head) * shape_.plane_bytes();
}
const std::byte* PageStore::k_plane(PageId id, int kv_head) const {
  return page(id) + size_t(kv_head) * shape_.plane_bytes();
}
std::byte* PageStore::v_plane(PageId id, int kv_head) {
  return page(id) + size_t(shape_.n_kv_heads + kv_head) * shape_.plane_bytes();
}
const std::byte* PageStore::v_plane(PageId id, int kv_head) const {
  return page(id) + size_t(shape_.n_kv_heads + kv_head) * shape_.plane_bytes();
}

SequenceKv::SequenceKv(PageStore& store)
    : store_(&store), page_tables_(size_t(store.shape().n_layers)) {}

SequenceKv::~SequenceKv() { clear(); }

void SequenceKv::reserve(int64_t n) {
  if (n < 0) throw InvalidArgument(fmt::format("SequenceKv::reserve: negative count {}", n));
  const int64_t page_size = shape().page_size;
  const int64_t need_pages = (n_tokens_ + n + page_size - 1) / page_size;
  // Allocate into a scratch list first so a failure leaves every table as it was.
  std::vector<PageId> fresh;
  const int64_t have_pages = int64_t(page_tables_[0].size());
  try {
    for (int64_t p = have_pages; p < need_pages; ++p) {
      for (size_t l = 0; l < page_tables_.size(); ++l) fresh.push_back(store_->allocate());
    }
  } catch (...) {
    for (PageId id : fresh) store_->release(id);
    throw;
  }
  size_t next = 0;
  for (int64_t p = have_pages; p < need_pages; ++p) {
    for (auto& table : page_tables_) table.push_back(fresh[next++]);
  }
  capacity_ = std::max(capacity_, int64_t(page_tables_[0].size()) * page_size);
}

void SequenceKv::write(int layer, int64_t pos, int64_t n, const float* k, const float* v) {
  const KvShape& s = shape();
  if (layer < 0 || layer >= s.n_layers) {
    throw InvalidArgument(fmt::format("SequenceKv::write: layer {} out of range [0, {})", layer, s.n_layers));
  }
  if (pos < 0 || n < 0 || pos + n > capacity_) {
    throw InvalidArgument(fmt::format(
        "SequenceKv::write: tokens [{}, {}) outside reserved space of {} tokens", pos, pos + n, capacity_));
  }
  const auto& table = page_tables_[size_t(layer)];
  const size_t row = size_t(s.n_kv_heads) * size_t(s.head_dim);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = pos + i;
    const PageId id = table[size_t(t / s.page_size)];
    const size_t slot = size_t(t % s.page_size) * size_t(s.head_dim);
    for (int h = 0; h < s.n_kv_heads; ++h) {
      const size_t src = size_t(i) * row + size_t(h) * size_t(s.head_dim);
      encode_elements(s.format, k + src, size_t(s.head_dim), store_->k_plane(id, h), slot);
      encode_elements(s.format, v + src, size_t(s.head_dim), store_->v_plane(id, h), slot);
    }
  }
}

void SequenceKv::commit(int64_t n) {
  if (n < 0 || n_tokens_ + n > capacity_) {
    throw InvalidArgument(fmt::format("SequenceKv::commit: {} tokens exceed reserved space", n));
  }
  n_tokens_ += n;
}

void SequenceKv::truncate(int64_t n) {
  if (n < 0 || n > n_tokens_) {
    throw InvalidArgument(fmt::format("SequenceKv::truncate: {} outside [0, {}]", n, n_tokens_));
  }
  n_tokens_ = n;
}

void SequenceKv::clear() {
  for (auto& table : page_tables_) {
    for (PageId id : table) store_->release(id);
    table.clear();
  }
  n_tokens_ = 0;
  capacity_ = 0;
}

std::span<const PageId> SequenceKv::page_table(int layer) const {
  if (layer < 0 || layer >= shape().n_layers) {
    throw InvalidArgument(fmt::format("SequenceKv::page_table: layer {} out of range", layer));
  }
  return page_tables_[size_t(layer)];
}

}  // namespace activekv::kv
