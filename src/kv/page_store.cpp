#include "activekv/kv/page_store.h"

#include <fmt/format.h>

#include <algorithm>

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

// One slab of page slots: ids [first, first + n), each page page_bytes long.
// state[i]: 0 free and zero, 1 live, 2 free and dirty (zeroed on reuse).
// Written once (add_slab) before it is published through n_slabs_.
struct PageStore::Slab {
  std::byte* data = nullptr;
  PageId first = 0;
  size_t n = 0;
  std::unique_ptr<std::atomic<uint8_t>[]> state;
};

namespace {
constexpr uint8_t kFreeClean = 0, kLive = 1, kFreeDirty = 2;
constexpr size_t kFirstSlabPages = 16;
}  // namespace

PageStore::PageStore(const KvShape& shape, size_t max_pages, HostMemory* memory)
    : shape_(shape), max_pages_(max_pages), memory_(memory ? memory : &plain_host_memory()),
      slabs_(std::make_unique<Slab[]>(kMaxSlabs)) {
  shape_.validate();
  blobs_ = std::make_unique<BlobArena>(*memory_);
  if (max_pages_ > 0) {
    if (shape_.n_layers > 1 && max_pages_ >= size_t(shape_.n_layers)) region_pages_ = max_pages_ / size_t(shape_.n_layers);
    add_slab(max_pages_);  // throws with the byte count if it does not fit
  }
}

PageStore::~PageStore() {
  const size_t n = n_slabs_.load();
  for (size_t i = 0; i < n; ++i) memory_->free(slabs_[i].data, slabs_[i].n * shape_.page_bytes());
}

void PageStore::add_slab(size_t n_pages) {
  const size_t i = n_slabs_.load(std::memory_order_relaxed);
  if (i == kMaxSlabs) throw Error("PageStore: too many slabs");
  const size_t bytes = n_pages * shape_.page_bytes();
  std::byte* data = nullptr;
  try {
    data = memory_->allocate(bytes);
  } catch (const Error& e) {
    throw Error(fmt::format("KV history of {} pages ({} bytes each, {} memory) does not fit: {}", n_pages,
                            shape_.page_bytes(), memory_->name(), e.what()));
  }
  Slab& s = slabs_[i];
  s.data = data;
  s.first = PageId(total_slots_);
  s.n = n_pages;
  s.state = std::make_unique<std::atomic<uint8_t>[]>(n_pages);
  for (size_t k = 0; k < n_pages; ++k) s.state[k].store(kFreeClean, std::memory_order_relaxed);
  for (size_t k = 0; k < n_pages; ++k) free_.insert(PageId(total_slots_ + k));
  total_slots_ += n_pages;
  n_slabs_.store(i + 1, std::memory_order_release);
}

const PageStore::Slab* PageStore::slab_of(PageId id) const {
  const size_t n = n_slabs_.load(std::memory_order_acquire);
  for (size_t i = 0; i < n; ++i) {
    const Slab& s = slabs_[i];
    if (id >= s.first && id - s.first < s.n) return &s;
  }
  return nullptr;
}

PageId PageStore::allocate(int layer) {
  if (free_.empty()) {
    if (max_pages_ != 0) {
      throw Error(fmt::format("PageStore: out of pages ({} pages of {} bytes in use, limit {})", in_use_,
                              shape_.page_bytes(), max_pages_));
    }
    add_slab(std::max(kFirstSlabPages, total_slots_));  // doubles the pool
  }
  auto it = free_.begin();
  if (region_pages_ > 0 && layer >= 0 && layer < shape_.n_layers) {
    const auto in_region = free_.lower_bound(PageId(size_t(layer) * region_pages_));
    if (in_region != free_.end() && *in_region < PageId(size_t(layer + 1) * region_pages_)) it = in_region;
  }
  const PageId id = *it;
  const Slab* s = slab_of(id);
  std::atomic<uint8_t>& state = s->state[id - s->first];
  if (state.load(std::memory_order_relaxed) == kFreeDirty) {
    std::fill_n(s->data + size_t(id - s->first) * shape_.page_bytes(), shape_.page_bytes(), std::byte{0});
  }
  state.store(kLive, std::memory_order_release);
  free_.erase(it);
  ++in_use_;
  return id;
}

void PageStore::release(PageId id) {
  const Slab* s = slab_of(id);
  if (!s || s->state[id - s->first].load(std::memory_order_relaxed) != kLive) {
    throw InvalidArgument(fmt::format("PageStore::release: page {} is not allocated", id));
  }
  s->state[id - s->first].store(kFreeDirty, std::memory_order_release);
  free_.insert(id);
  --in_use_;
}

std::byte* PageStore::page_data(PageId id) const {
  const Slab* s = slab_of(id);
  if (!s || s->state[id - s->first].load(std::memory_order_acquire) != kLive) {
    throw InvalidArgument(fmt::format("PageStore: page {} is not allocated", id));
  }
  return s->data + size_t(id - s->first) * shape_.page_bytes();
}

std::byte* PageStore::k_plane(PageId id, int kv_head) const {
  return page_data(id) + size_t(kv_head) * shape_.plane_bytes();
}
std::byte* PageStore::v_plane(PageId id, int kv_head) const {
  return page_data(id) + size_t(shape_.n_kv_heads + kv_head) * shape_.plane_bytes();
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
      for (size_t l = 0; l < page_tables_.size(); ++l) fresh.push_back(store_->allocate(int(l)));
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
