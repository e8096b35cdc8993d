#include "activekv/convert/compressed_history.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace activekv::convert {

CompressedHistory::CompressedHistory(const kv::SequenceKv& seq, std::vector<kv::CodecFormat> formats,
                                     size_t max_pages, ConversionPool* pool, EncodeFn encode)
    : seq_(&seq),
      shape_(seq.shape()),
      formats_(std::move(formats)),
      max_pages_(max_pages),
      pool_(pool),
      encode_(std::move(encode)),
      counts_(formats_.size()) {
  if (shape_.format != kv::PageFormat::bf16) {
    throw InvalidArgument("CompressedHistory: compressed formats are converted from bf16 pages only");
  }
  if (!encode_) {
    encode_ = [](kv::CodecFormat f, const kv::KvShape& s, std::span<const bf16> page, int n) {
      return kv::encode_page(f, s, page, n);
    };
  }
  // Chunks sized to a layer's bf16 history (an encoded page is smaller), 64 KiB..64 MiB.
  const size_t chunk = std::clamp<size_t>(max_pages_ * shape_.page_bytes(), size_t(64) << 10, size_t(64) << 20);
  for (size_t i = 0; i < formats_.size() * size_t(shape_.n_layers); ++i)
    arenas_.push_back(std::make_unique<kv::BlobArena>(seq.store().memory(), 0, chunk));
  const size_t n = formats_.size() * size_t(shape_.n_layers) * max_pages_;
  published_ = std::make_unique<std::atomic<const Published*>[]>(n);
  owned_ = std::make_unique<std::unique_ptr<const Published>[]>(n);
  for (size_t i = 0; i < n; ++i) published_[i].store(nullptr, std::memory_order_relaxed);
}

CompressedHistory::~CompressedHistory() {
  if (pool_) pool_->cancel(this);
}

size_t CompressedHistory::slot(size_t f, int layer, size_t page) const {
  return (f * size_t(shape_.n_layers) + size_t(layer)) * max_pages_ + page;
}

// Runs on a pool thread: reads only `src` (a full page) and this object's
// immutable fields and its own slot.
void CompressedHistory::convert(size_t f, int layer, size_t page, const bf16* src) {
  auto pub = std::make_unique<Published>();
  {
    const kv::EncodedPage enc =
        encode_(formats_[f], shape_, std::span<const bf16>(src, shape_.page_elements()), shape_.page_size);
    kv::BlobArena* arena = arenas_[f * size_t(shape_.n_layers) + size_t(layer)].get();
    pub->blob = arena->allocate(enc.bytes.size());  // throws with the sizes when memory is short
    pub->arena = arena;
    std::memcpy(pub->blob.data, enc.bytes.data(), enc.bytes.size());
  }
  // The one validation this page gets: the kernels read its view unchecked.
  const std::span<const std::byte> blob(pub->blob.data, pub->blob.bytes);
  try {
    if (formats_[f] == kv::CodecFormat::int8s) {
      pub->int8s = kv::parse_int8s_page(blob);
    } else {
      pub->lossless13 = kv::parse_lossless13_page(blob);
    }
  } catch (const Error& e) {
    throw Error(fmt::format("CompressedHistory: {} page {} of layer {} rejected at publication: {}",
                            kv::codec_name(formats_[f]), page, layer, e.what()));
  }
  const kv::PageHeader& h = formats_[f] == kv::CodecFormat::int8s ? pub->int8s.header : pub->lossless13.header;
  if (h.page_size != shape_.page_size || h.n_kv_heads != shape_.n_kv_heads || h.head_dim != shape_.head_dim ||
      h.n_tokens != shape_.page_size) {
    throw Error(fmt::format("CompressedHistory: {} page {} of layer {} rejected at publication: it holds page {}, "
                            "heads {}, dim {}, tokens {}; the history needs page {}, heads {}, dim {}, tokens {}",
                            kv::codec_name(formats_[f]), page, layer, h.page_size, h.n_kv_heads, h.head_dim,
                            h.n_tokens, shape_.page_size, shape_.n_kv_heads, shape_.head_dim, shape_.page_size));
  }
  const size_t i = slot(f, layer, page);
  owned_[i] = std::move(pub);
  published_[i].store(owned_[i].get(), std::memory_order_release);
  counts_[f].fetch_add(1, std::memory_order_relaxed);
}

void CompressedHistory::schedule() {
  const size_t full = size_t(seq_->n_tokens() / shape_.page_size);
  if (full > max_pages_) {
    throw Error(fmt::format("CompressedHistory: {} full pages exceed the {} reserved", full, max_pages_));
  }
  const size_t first = scheduled_pages_;
  scheduled_pages_ = std::max(scheduled_pages_, full);  // before converting: a failure is not retried
  for (size_t page = first; page < full; ++page) {
    for (int layer = 0; layer < shape_.n_layers; ++layer) {
      // Captured here, on the writer's thread: the page's address is stable
      // while the page is allocated, the table and directory are not.
      const kv::PageId id = seq_->page_table(layer)[page];
      const auto* src = reinterpret_cast<const bf16*>(seq_->store().k_plane(id, 0));
      for (size_t f = 0; f < formats_.size(); ++f) {
        if (pool_) {
          pool_->submit(this, [this, f, layer, page, src] { convert(f, layer, page, src); });
        } else {
          convert(f, layer, page, src);
        }
      }
    }
  }
}

void CompressedHistory::wait() {
  if (pool_) pool_->wait(this);
}

void CompressedHistory::clear() {
  if (pool_) pool_->cancel(this);
  const size_t n = formats_.size() * size_t(shape_.n_layers) * max_pages_;
  for (size_t i = 0; i < n; ++i) {
    published_[i].store(nullptr, std::memory_order_relaxed);
    owned_[i].reset();
  }
  for (auto& c : counts_) c.store(0);
  scheduled_pages_ = 0;
}

const CompressedHistory::Published* CompressedHistory::find(int layer, size_t page, kv::CodecFormat format) const {
  for (size_t f = 0; f < formats_.size(); ++f) {
    if (formats_[f] == format && page < max_pages_) {
      return published_[slot(f, layer, page)].load(std::memory_order_acquire);
    }
  }
  return nullptr;
}

std::span<const std::byte> CompressedHistory::published(int layer, size_t page, kv::CodecFormat format) const {
  const Published* p = find(layer, page, format);
  return p ? std::span<const std::byte>(p->blob.data, p->blob.bytes) : std::span<const std::byte>();
}

const kv::Int8sPageView* CompressedHistory::int8s_view(int layer, size_t page) const {
  const Published* p = find(layer, page, kv::CodecFormat::int8s);
  return p ? &p->int8s : nullptr;
}

const kv::Lossless13PageView* CompressedHistory::lossless13_view(int layer, size_t page) const {
  const Published* p = find(layer, page, kv::CodecFormat::lossless13);
  return p ? &p->lossless13 : nullptr;
}

size_t CompressedHistory::published_count(kv::CodecFormat format) const {
  size_t n = 0;
  for (size_t f = 0; f < formats_.size(); ++f) {
    if (formats_[f] == format) n += counts_[f].load(std::memory_order_relaxed);
  }
  return n;
}

}  // namespace activekv::convert
