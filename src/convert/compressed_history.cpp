#include "activekv/convert/compressed_history.h"

#include <fmt/format.h>

#include <algorithm>

namespace activekv::convert {

CompressedHistory::CompressedHistory(const kv::SequenceKv& seq, std::vector<kv::CodecFormat> formats,
                                     size_t max_pages, ConversionPool* pool)
    : seq_(&seq), formats_(std::move(formats)), max_pages_(max_pages), pool_(pool), counts_(formats_.size()) {
  if (seq.shape().format != kv::PageFormat::bf16) {
    throw InvalidArgument("CompressedHistory: compressed formats are converted from bf16 pages only");
  }
  const size_t n = formats_.size() * size_t(seq.shape().n_layers) * max_pages_;
  published_ = std::make_unique<std::atomic<const kv::EncodedPage*>[]>(n);
  owned_ = std::make_unique<std::unique_ptr<const kv::EncodedPage>[]>(n);
  for (size_t i = 0; i < n; ++i) published_[i].store(nullptr, std::memory_order_relaxed);
}

CompressedHistory::~CompressedHistory() {
  if (pool_) pool_->cancel(this);
}

size_t CompressedHistory::slot(size_t f, int layer, size_t page) const {
  return (f * size_t(seq_->shape().n_layers) + size_t(layer)) * max_pages_ + page;
}

void CompressedHistory::convert(size_t f, int layer, size_t page) {
  const kv::PageId id = seq_->page_table(layer)[page];
  const size_t i = slot(f, layer, page);
  owned_[i] = std::make_unique<const kv::EncodedPage>(
      kv::encode_page(formats_[f], seq_->store(), id, seq_->shape().page_size));
  published_[i].store(owned_[i].get(), std::memory_order_release);
  counts_[f].fetch_add(1, std::memory_order_relaxed);
}

void CompressedHistory::schedule() {
  const size_t full = size_t(seq_->n_tokens() / seq_->shape().page_size);
  if (full > max_pages_) {
    throw Error(fmt::format("CompressedHistory: {} full pages exceed the {} reserved", full, max_pages_));
  }
  for (size_t page = scheduled_pages_; page < full; ++page) {
    for (size_t f = 0; f < formats_.size(); ++f) {
      for (int layer = 0; layer < seq_->shape().n_layers; ++layer) {
        if (pool_) {
          pool_->submit(this, [this, f, layer, page] { convert(f, layer, page); });
        } else {
          convert(f, layer, page);
        }
      }
    }
  }
  scheduled_pages_ = std::max(scheduled_pages_, full);
}

void CompressedHistory::wait() {
  if (pool_) pool_->wait(this);
}

void CompressedHistory::clear() {
  if (pool_) pool_->cancel(this);
  const size_t n = formats_.size() * size_t(seq_->shape().n_layers) * max_pages_;
  for (size_t i = 0; i < n; ++i) {
    published_[i].store(nullptr, std::memory_order_relaxed);
    owned_[i].reset();
  }
  for (auto& c : counts_) c.store(0);
  scheduled_pages_ = 0;
}

const kv::EncodedPage* CompressedHistory::published(int layer, size_t page, kv::CodecFormat format) const {
  for (size_t f = 0; f < formats_.size(); ++f) {
    if (formats_[f] == format && page < max_pages_) {
      return published_[slot(f, layer, page)].load(std::memory_order_acquire);
    }
  }
  return nullptr;
}

size_t CompressedHistory::published_count(kv::CodecFormat format) const {
  size_t n = 0;
  for (size_t f = 0; f < formats_.size(); ++f) {
    if (formats_[f] == format) n += counts_[f].load(std::memory_order_relaxed);
  }
  return n;
}

}  // namespace activekv::convert
