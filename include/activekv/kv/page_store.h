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
// Pages come from a PageStore (slabs of page slots with a free list, and an
// arena for encoded pages). Each sequence owns a
// SequenceKv: one page table (list of page ids in token order) per layer, and
// the number of tokens written. Attention reads K/V only through the page
// table, never through a contiguous copy of the history.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <vector>

#include "activekv/core/bf16.h"
#include "activekv/core/error.h"
#include "activekv/kv/blob_arena.h"
#include "activekv/kv/host_memory.h"
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

/// The one pool of host pages: bf16 (or f32) page slots in slabs, plus the
/// arena of encoded pages (blobs()), all from one HostMemory -- plain for the
/// CPU path, pinned when the GPU runtime streams the pages (host_memory.h).
///
/// A bounded store (max_pages > 0) takes its one slab when it is built, so a
/// history that does not fit is refused up front, and gives each layer a
/// region of max_pages / n_layers slots: a sequence's pages of one layer are
/// then adjacent in memory and stream as few large copies. An unbounded store
/// adds slabs of growing size as needed. Slabs never move.
///
/// Threads: allocate() and release() belong to one thread (the decode
/// thread); page_data() and the plane accessors of a live page may be called
/// from any thread at any time (background conversion reads full pages while
/// decode allocates new ones). blobs() is thread-safe.
class PageStore {
 public:
  /// `max_pages` bounds the pool (0 = unbounded); `memory` supplies the bytes
  /// (nullptr: plain_host_memory()). Throws InvalidArgument on a bad shape and
  /// Error naming the bytes when a bounded store's slab cannot be had.
  explicit PageStore(const KvShape& shape, size_t max_pages = 0, HostMemory* memory = nullptr);
  ~PageStore();
  PageStore(const PageStore&) = delete;
  PageStore& operator=(const PageStore&) = delete;

  const KvShape& shape() const { return shape_; }

  /// Returns a zero-filled page, from `layer`'s region when the store has
  /// regions and that region has a free slot (else any free slot). Throws
  /// Error if the pool is at max_pages or memory cannot be had; the pool is
  /// unchanged then.
  PageId allocate(int layer = -1);
  /// Returns a page to the pool. Throws InvalidArgument for an id that is not allocated.
  void release(PageId id);

  /// The whole page `id`: shape().page_bytes() bytes in the layout above.
  /// Throws InvalidArgument for an unallocated page.
  std::byte* page_data(PageId id) const;
  /// K plane of `kv_head` in page `id`: [page_size][head_dim] elements of
  /// shape().format. Throws InvalidArgument for an unallocated page.
  std::byte* k_plane(PageId id, int kv_head) const;
  /// V plane of `kv_head` in page `id`, same layout.
  std::byte* v_plane(PageId id, int kv_head) const;

  size_t pages_in_use() const { return in_use_; }
  size_t max_pages() const { return max_pages_; }
  /// The memory of the slabs and the arena; pinned() if the GPU can DMA from it.
  HostMemory& memory() const { return *memory_; }
  bool pinned() const { return memory_->pinned(); }
  /// Encoded pages (thread-safe).
  BlobArena& blobs() const { return *blobs_; }

 private:
  struct Slab;
  static constexpr size_t kMaxSlabs = 48;
  const Slab* slab_of(PageId id) const;
  void add_slab(size_t n_pages);

  KvShape shape_;
  size_t max_pages_;
  HostMemory* memory_;
  size_t region_pages_ = 0;  // 0: no per-layer regions
  std::unique_ptr<Slab[]> slabs_;    // kMaxSlabs entries, the first n_slabs_ valid
  std::atomic<size_t> n_slabs_{0};
  size_t total_slots_ = 0, in_use_ = 0;
  std::set<PageId> free_;  // free slot ids, lowest first
  std::unique_ptr<BlobArena> blobs_;
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
