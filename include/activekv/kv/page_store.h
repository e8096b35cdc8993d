// Host KV history: pages, the page pool and per-sequence page tables.
//
// A *page* holds `page_size` consecutive tokens of one layer: K and V for all
// KV heads (SPEC §2). Layout of one page, elements of the page's format:
//
//   K planes: [n_kv_heads][page_size][head_dim]
//   V planes: [n_kv_heads][page_size][head_dim]   (right after the K planes)
//
// Head-major, so that one (page, KV head, K|V) *plane* is contiguous: that is
// the unit the compressed codecs encode and the unit a GQA kernel reads once
// for all the query heads of its group.
//
// Pages come from a PageStore (a pool with a free list). Each sequence owns a
// SequenceKv: one page table (list of page ids in token order) per layer, and
// the number of tokens written. Attention reads K/V only through the page
// table, never through a contiguous copy of the history.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "activekv/core/bf16.h"
#include "activekv/core/error.h"
#include "activekv/kv/page_format.h"

namespace activekv::kv {

/// Identifies one page inside a PageStore.
using PageId = uint32_t;

/// Shape of the history of one model: what a page holds.
struct KvShape {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int page_size = 1024;  ///< tokens per page
  PageFormat format = PageFormat::bf16;  ///< how written pages store K/V

  /// Elements in one plane (one page, one KV head, K or V).
  size_t plane_elements() const { return size_t(page_size) * size_t(head_dim); }
  /// Elements in one page (K and V for every KV head).
  size_t page_elements() const { return 2 * size_t(n_kv_heads) * plane_elements(); }
  /// Bytes of one plane and of one page in this shape's format.
  size_t plane_bytes() const { return plane_elements() * element_bytes(format); }
  size_t page_bytes() const { return page_elements() * element_bytes(format); }
  /// History bytes per token per layer (K and V of every KV head).
  size_t bytes_per_token_per_layer() const {
    return 2 * size_t(n_kv_heads) * size_t(head_dim) * element_bytes(format);
  }
  /// Throws InvalidArgument naming the field if any field is not positive.
  void validate() const;
};

/// A pool of pages in host memory. Not thread-safe for allocate/release;
/// page contents may be read concurrently once written.
class PageStore {
 public:
  /// `max_pages` bounds the pool (0 = unbounded). Throws InvalidArgument on a bad shape.
  explicit PageStore(const KvShape& shape, size_t max_pages = 0);

  const KvShape& shape() const { return shape_; }

  /// Returns a zero-filled page. Throws Error if the pool is at max_pages or
  /// memory cannot be allocated; the pool is unchanged then.
  PageId allocate();
  /// Returns a page to the free list. Throws InvalidArgument for an id that is not allocated.
  void release(PageId id);

  /// K plane of `kv_head` in page `id`: [page_size][head_dim] elements of
  /// shape().format. Throws InvalidArgument for an unallocated page.
  std::byte* k_plane(PageId id, int kv_head);
  const std::byte* k_plane(PageId id, int kv_head) const;
  /// V plane of `kv_head` in page `id`, same layout.
  std::byte* v_plane(PageId id, int kv_head);
  const std::byte* v_plane(PageId id, int kv_head) const;

  size_t pages_in_use() const { return pages_.size() - free_.size(); }

 private:
  std::byte* page(PageId id) const;

  KvShape shape_;
  size_t max_pages_;
  std::vector<std::unique_ptr<std::byte[]>> pages_;
  std::vector<bool> live_;
  std::vector<PageId> free_;
};

/// The history of one sequence: one page table per layer and the token count.
///
/// Tokens are appended layer by layer during a forward pass: for a batch of
/// `n` new tokens, call reserve(n) once, write each layer with write(), then
/// commit(n). Reading (attention) sees tokens [0, n_tokens() + pending) for
/// the layer being written only through the explicit positions passed to it.
class SequenceKv {
 public:
  explicit SequenceKv(PageStore& store);
  ~SequenceKv();
  SequenceKv(const SequenceKv&) = delete;
  SequenceKv& operator=(const SequenceKv&) = delete;

  PageStore& store() const { return *store_; }
  const KvShape& shape() const { return store_->shape(); }

  /// Tokens committed so far.
  int64_t n_tokens() const { return n_tokens_; }

  /// Makes room for `n` more tokens in every layer (allocates pages).
  /// Throws Error if the store is full; nothing already stored is lost.
  void reserve(int64_t n);
  /// Writes K and V of tokens [pos, pos + n) of `layer`, converting fp32 to
  /// the page format (bf16: round to nearest even).
  /// k and v: [n][n_kv_heads][head_dim] fp32 (the projection's natural layout).
  /// Positions must lie inside reserved space; throws InvalidArgument otherwise.
  void write(int layer, int64_t pos, int64_t n, const float* k, const float* v);
  /// Marks `n` reserved tokens as written in every layer.
  void commit(int64_t n);
  /// Forgets tokens [n, n_tokens()) (0 <= n <= n_tokens()); their pages stay
  /// reserved and are overwritten by later writes. Throws InvalidArgument.
  void truncate(int64_t n);
  /// Drops all tokens and returns the pages to the store.
  void clear();

  /// Page table of `layer`: page ids in token order.
  std::span<const PageId> page_table(int layer) const;

 private:
  PageStore* store_;
  int64_t n_tokens_ = 0;
  int64_t capacity_ = 0;
  std::vector<std::vector<PageId>> page_tables_;  // [layer][page index]
};

}  // namespace activekv::kv
