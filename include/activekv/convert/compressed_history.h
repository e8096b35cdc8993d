// Published compressed pages of one sequence, and their background conversion.
//
// After each commit, pages that are fully written in every layer are queued
// for conversion into each wanted codec format. A conversion job reads the
// bf16 page (full pages are never written again) and publishes the encoded
// page with one atomic pointer store (release); readers load it (acquire) and
// get either the complete page or nullptr, in which case the route serves the
// page exact. Decode never waits for conversion. Each (format, layer, page)
// slot is written by exactly one job, and published pages stay alive until
// clear() or destruction, which run on the reading thread after cancelling
// the jobs.
//
// Lifetime: a CompressedHistory must be destroyed (or clear()ed) before the
// SequenceKv it reads from releases its pages; the destructor cancels queued
// jobs and waits for running ones.
#pragma once

#include <atomic>
#include <memory>
#include <utility>
#include <vector>

#include "activekv/convert/conversion_pool.h"
#include "activekv/kv/codec.h"
#include "activekv/kv/page_store.h"

namespace activekv::convert {

class CompressedHistory {
 public:
  /// `formats`: codecs to produce for every full page. `max_pages`: pages per
  /// layer this history may reach (slots are allocated up front so readers
  /// never race with growth). `pool` may be nullptr: conversion then runs
  /// synchronously inside schedule() (deterministic, for eval and tests).
  /// Throws InvalidArgument if the sequence's pages are not bf16.
  CompressedHistory(const kv::SequenceKv& seq, std::vector<kv::CodecFormat> formats,
                    size_t max_pages, ConversionPool* pool);
  ~CompressedHistory();
  CompressedHistory(const CompressedHistory&) = delete;
  CompressedHistory& operator=(const CompressedHistory&) = delete;

  /// Queues the pages that became full since the last call. Never blocks on
  /// conversion (with a pool). Throws Error if the history outgrew max_pages.
  void schedule();
  /// Waits until every queued conversion has finished (eval, tests, shutdown).
  void wait();
  /// Cancels queued conversions and forgets published pages (before the
  /// sequence is cleared).
  void clear();

  /// The published page, or nullptr if not (yet) converted into `format`.
  /// Valid until clear() or destruction.
  const kv::EncodedPage* published(int layer, size_t page, kv::CodecFormat format) const;
  /// Pages published so far in `format`, over all layers.
  size_t published_count(kv::CodecFormat format) const;

 private:
  size_t slot(size_t format_index, int layer, size_t page) const;
  void convert(size_t format_index, int layer, size_t page);

  const kv::SequenceKv* seq_;
  std::vector<kv::CodecFormat> formats_;
  size_t max_pages_;
  ConversionPool* pool_;
  size_t scheduled_pages_ = 0;  // full pages already queued (all layers, all formats)
  std::unique_ptr<std::atomic<const kv::EncodedPage*>[]> published_;  // [format][layer][page]
  std::unique_ptr<std::unique_ptr<const kv::EncodedPage>[]> owned_;   // same index; one writer each
  std::vector<std::atomic<size_t>> counts_;  // published per format
};

}  // namespace activekv::convert
