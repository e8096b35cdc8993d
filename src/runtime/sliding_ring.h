// Internal to the GPU runtime: the history of the sliding-window layers
// (Gemma 3's local layers), which lives only on the GPU.
//
// A layer with window W attends, at position p, the keys (p - W, p]. Its
// history is a ring of `ring_pages` device pages of the store's layout
// (decode_attention.h): page i of the layer's history is ring page i mod
// ring_pages. The ring holds the last W + 32 + max_rows tokens (the window
// before a chunk of max_rows rows, the chunk itself, and the 32-token block
// the prefill kernel reads a window from), so a page is overwritten only
// once no query can see it. Nothing of these layers goes to host pages,
// streams, or is converted to a compressed format: their bytes per step are
// at most W tokens, read in place.
//
// Each sliding layer also has a static device page table of `n_pages`
// entries (ring page i mod ring_pages), the page table prefill attention
// reads with its window.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "activekv/cuda/decode_attention.h"
#include "device_buffer.h"

namespace activekv::runtime {

class SlidingRing {
 public:
  /// Pages in a ring for `window` tokens and chunks of up to `max_rows` rows:
  /// the most pages W + 32 + max_rows consecutive tokens can touch.
  static int64_t ring_pages(int window, int max_rows, int page_size);
  /// Device bytes the rings and tables of the constructor's arguments take
  /// (0 without a sliding layer): what a budget must leave for them.
  static size_t bytes_for(const cuda::AttnShape& attn, const std::vector<int>& windows, int max_rows,
                          int64_t n_pages);

  /// Rings for the layers with windows[l] > 0 (all of one window), tables of
  /// `n_pages` entries each; zeroed device memory. Throws CudaError naming
  /// the bytes when it does not fit, InvalidArgument for sliding layers of
  /// different windows.
  SlidingRing(const cuda::AttnShape& attn, const std::vector<int>& windows, int max_rows, int64_t n_pages);

  bool sliding(int layer) const { return index_[size_t(layer)] >= 0; }
  int window() const { return window_; }
  int n_layers() const { return n_sliding_; }
  int64_t pages_per_ring() const { return ring_pages_; }
  /// Rows a chunk may have (the ring's size assumes at most these).
  int max_rows() const { return max_rows_; }
  /// Device address of page `page` (of the layer's history) of sliding layer `layer`.
  std::byte* page(int layer, int64_t page) const;
  /// Device page table [n_pages] of sliding layer `layer` (for prefill attention).
  const void* const* table(int layer) const;
  /// Device bytes of the rings and tables.
  size_t device_bytes() const { return bytes_; }

 private:
  cuda::AttnShape attn_;
  std::vector<int> index_;  // [model layer] -> sliding index, or -1
  int n_sliding_ = 0, window_ = 0, max_rows_ = 0;
  int64_t ring_pages_ = 0, n_pages_ = 0;
  size_t bytes_ = 0;
  std::unique_ptr<cuda::DevBuf> pages_;   // [n_sliding][ring_pages] pages
  std::unique_ptr<cuda::DevBuf> tables_;  // [n_sliding][n_pages] device page pointers
};

}  // namespace activekv::runtime
