// See sliding_ring.h.
#include "sliding_ring.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

namespace activekv::runtime {

int64_t SlidingRing::ring_pages(int window, int max_rows, int page_size) {
  const int64_t span = int64_t(window) + 32 + int64_t(max_rows);  // tokens a chunk's attention may touch
  return (span + page_size - 1) / page_size + 1;                  // a span can straddle one more page
}

size_t SlidingRing::bytes_for(const cuda::AttnShape& attn, const std::vector<int>& windows, int max_rows,
                              int64_t n_pages) {
  int n = 0, window = 0;
  for (int w : windows)
    if (w > 0) {
      ++n;
      window = w;
    }
  if (n == 0) return 0;
  return size_t(n) * size_t(ring_pages(window, max_rows, attn.page_size)) * attn.page_bytes() +
         size_t(n) * size_t(n_pages) * sizeof(void*);
}

SlidingRing::SlidingRing(const cuda::AttnShape& attn, const std::vector<int>& windows, int max_rows, int64_t n_pages)
    : attn_(attn), index_(windows.size(), -1), max_rows_(max_rows), n_pages_(n_pages) {
  for (size_t l = 0; l < windows.size(); ++l) {
    if (windows[l] <= 0) continue;
    if (window_ != 0 && windows[l] != window_)
      throw InvalidArgument(fmt::format("SlidingRing: layer {} has window {}, an earlier one {} (one window only)", l,
                                        windows[l], window_));
    window_ = windows[l];
    index_[l] = n_sliding_++;
  }
  if (n_sliding_ == 0) return;
  ring_pages_ = ring_pages(window_, max_rows, attn.page_size);
  const size_t n_ring = size_t(n_sliding_) * size_t(ring_pages_);
  pages_ = std::make_unique<cuda::DevBuf>(n_ring * attn.page_bytes(), "the sliding layers' rings");
  tables_ = std::make_unique<cuda::DevBuf>(size_t(n_sliding_) * size_t(n_pages) * sizeof(void*),
                                           "the sliding layers' page tables");
  bytes_ = n_ring * attn.page_bytes() + size_t(n_sliding_) * size_t(n_pages) * sizeof(void*);
  // Zeroed: a prefill block reads (and masks) keys of its first block before
  // the window; they were written, but zero keeps any unwritten slot finite.
  cuda::check_cuda(cudaMemset(pages_->p, 0, n_ring * attn.page_bytes()), "clear the sliding layers' rings");
  std::vector<const void*> t(size_t(n_sliding_) * size_t(n_pages));
  for (size_t l = 0; l < windows.size(); ++l)
    if (index_[l] >= 0)
      for (int64_t p = 0; p < n_pages; ++p) t[size_t(index_[l]) * size_t(n_pages) + size_t(p)] = page(int(l), p);
  cuda::check_cuda(cudaMemcpy(tables_->p, t.data(), t.size() * sizeof(void*), cudaMemcpyHostToDevice),
                   "upload the sliding layers' page tables");
}

std::byte* SlidingRing::page(int layer, int64_t page) const {
  const int i = index_[size_t(layer)];
  if (i < 0) throw InvalidArgument(fmt::format("SlidingRing: layer {} does not slide", layer));
  const size_t slot = size_t(i) * size_t(ring_pages_) + size_t(page % ring_pages_);
  return pages_->as<std::byte>() + slot * attn_.page_bytes();
}

const void* const* SlidingRing::table(int layer) const {
  const int i = index_[size_t(layer)];
  if (i < 0) throw InvalidArgument(fmt::format("SlidingRing: layer {} does not slide", layer));
  return tables_->as<const void*>() + size_t(i) * size_t(n_pages_);
}

}  // namespace activekv::runtime
