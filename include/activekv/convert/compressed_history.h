// Published compressed pages of one sequence, and their background conversion.
//
// After each commit, pages that are fully written in every layer are queued
// for conversion into each wanted codec format. A conversion job encodes the
// bf16 page (full pages are never written again), validates the blob once
// (kv::parse_int8s_page / kv::parse_lossless13_page: header, checksum,
// metadata, and the dimensions against the history's shape), and publishes
// the blob with its validated view by one atomic pointer store (release);
// readers load it (acquire) and get either the complete page or nullptr, in
// which case the route serves the page exact. A page that fails validation is
// never published: it stays exact. Readers of a published view validate
// nothing. Decode never waits for conversion. Each (format, layer, page) slot
// is written by exactly one job, and published pages stay alive until clear()
// or destruction, which run on the reading thread after cancelling the jobs.
//
// Threads: schedule() runs on the thread that writes the sequence (decode).
// It reads the page table and the page store there and hands each job the
// page's address; a job reads only those bytes (a full page, which nothing
// writes any more), never the page tables or the store's directory, which
// SequenceKv::reserve grows concurrently.
//
// Published blobs live in arenas of this object, one per format and layer,
// on the page store's memory (kv::PageStore::memory()) like the bf16 pages:
// pinned in the GPU runtime. A layer's pages converted in page order sit
// back to back (256-byte aligned), so a streamed step copies runs of them.
//
// Lifetime: a CompressedHistory must be destroyed (or clear()ed) before the
// SequenceKv it reads from releases or rewrites its pages (clear, truncate);
// the destructor cancels queued jobs and waits for running ones.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "activekv/convert/conversion_pool.h"
#include "activekv/kv/codec.h"
#include "activekv/kv/codec_int8s.h"
#include "activekv/kv/codec_lossless13.h"
#include "activekv/kv/page_store.h"

namespace activekv::convert {

class CompressedHistory {
 public:
  /// Encodes the first n_tokens tokens of one bf16 page (PageStore layout)
  /// into `format`: kv::encode_page unless a test injects another encoder.
  using EncodeFn = std::function<kv::EncodedPage(kv::CodecFormat format, const kv::KvShape& shape,
                                                 std::span<const bf16> page, int n_tokens)>;

  /// `formats`: codecs to produce for every full page. `max_pages`: pages per
  /// layer this history may reach (slots are allocated up front so readers
  /// never race with growth). `pool` may be nullptr: conversion then runs
  /// synchronously inside schedule() (deterministic, for eval and tests).
  /// `encode`: empty means kv::encode_page.
  /// Throws InvalidArgument if the sequence's pages are not bf16.
  CompressedHistory(const kv::SequenceKv& seq, std::vector<kv::CodecFormat> formats, size_t max_pages,
                    ConversionPool* pool, EncodeFn encode = {});
  ~CompressedHistory();
  CompressedHistory(const CompressedHistory&) = delete;
  CompressedHistory& operator=(const CompressedHistory&) = delete;

  /// Queues the pages that became full since the last call (call it on the
  /// thread that writes the sequence). Never blocks on conversion (with a
  /// pool); a job that fails (encoding or validation) is logged by the pool
  /// and its page stays exact. Without a pool the failure throws from here
  /// (Error), and the pages after it in this call stay exact.
  /// Throws Error if the history outgrew max_pages.
  void schedule();
  /// Waits until every queued conversion has finished (eval, tests, shutdown).
  void wait();
  /// Cancels queued conversions and forgets published pages (before the
  /// sequence is cleared).
  void clear();

  /// The published blob (header + payload, in the page store's arena: pinned
  /// when the store is, so the GPU streams it by DMA), or an empty span if
  /// not (yet) converted into `format`. Validated at publication. Valid until
  /// clear() or destruction.
  std::span<const std::byte> published(int layer, size_t page, kv::CodecFormat format) const;
  /// The published page's view, validated once at publication (what the CPU
  /// kernels read), or nullptr if not (yet) published in that format (or
  /// that format is not produced). Valid until clear() or destruction.
  const kv::Int8sPageView* int8s_view(int layer, size_t page) const;
  const kv::Lossless13PageView* lossless13_view(int layer, size_t page) const;
  /// Pages published so far in `format`, over all layers.
  size_t published_count(kv::CodecFormat format) const;

 private:
  /// A published page: the blob in its layer's arena and its view (the one
  /// matching its format). Returns the blob to the arena when destroyed.
  struct Published {
    kv::BlobArena* arena = nullptr;
    kv::Blob blob;
    kv::Int8sPageView int8s;
    kv::Lossless13PageView lossless13;
    ~Published() {
      if (arena && blob.data) arena->release(blob);
    }
  };
  size_t slot(size_t format_index, int layer, size_t page) const;
  const Published* find(int layer, size_t page, kv::CodecFormat format) const;
  void convert(size_t format_index, int layer, size_t page, const bf16* src);

  const kv::SequenceKv* seq_;  // read by schedule() only (the writer's thread)
  kv::KvShape shape_;          // copy: jobs read no SequenceKv or PageStore state
  // One encoded-page arena per (format, layer), on the store's memory: a
  // layer's pages, published in page order, lie one after another (256-byte
  // aligned), so the decode engine copies a run of them as one copy instead
  // of one per page (2 MiB copies reach 51.9 GB/s on the H200, 64 MiB ones
  // 55.4). Declared before owned_: the published blobs go back first.
  std::vector<std::unique_ptr<kv::BlobArena>> arenas_;  // [format][layer], thread-safe
  std::vector<kv::CodecFormat> formats_;
  size_t max_pages_;
  ConversionPool* pool_;
  EncodeFn encode_;
  size_t scheduled_pages_ = 0;  // full pages already queued (all layers, all formats)
  std::unique_ptr<std::atomic<const Published*>[]> published_;  // [format][layer][page]
  std::unique_ptr<std::unique_ptr<const Published>[]> owned_;   // same index; one writer each
  std::vector<std::atomic<size_t>> counts_;  // published per format
};

}  // namespace activekv::convert
