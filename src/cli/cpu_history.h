// The CPU path's KV history of one sequence, as --kv-format asks: the page
// store, the sequence, background conversion of full pages (compressed
// formats) and the routed view the forward pass reads it along. Shared by
// `generate --device cpu` and `bench --device cpu`, so both measure the same
// thing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "activekv/convert/compressed_history.h"
#include "activekv/convert/conversion_pool.h"
#include "activekv/kv/page_store.h"
#include "activekv/model/llama_model.h"
#include "activekv/route/routed_attention.h"

namespace activekv::cli {

/// --kv-format: bf16/f32 are exact routes over pages of that format; the
/// compressed formats (lossless13, int8s, hybrid) read bf16 pages converted in
/// the background.
struct HistoryPlan {
  kv::PageFormat page_format = kv::PageFormat::bf16;
  route::RouteKind route = route::RouteKind::exact;
  std::vector<kv::CodecFormat> codecs;
};
/// Throws InvalidArgument naming an unknown format.
HistoryPlan plan_history(const std::string& kv_format);

struct CpuHistoryOptions {
  std::string kv_format = "bf16";
  int page_size = 1024;     ///< tokens per page
  int recent_pages = 2;     ///< hybrid: full pages before the tail kept exact
  int tile_pages = 32;      ///< pages per attention tile
  int convert_threads = 1;  ///< background conversion threads (compressed formats)
};

/// Not movable: the view points at the compressed history it owns.
class CpuHistory {
 public:
  /// Sized for n_ctx tokens of `lm`'s shape. Throws Error (memory.h,
  /// require_page_store: the bytes asked and available) when the store cannot
  /// be held, InvalidArgument for an unknown format.
  CpuHistory(const model::LlamaModel& lm, const CpuHistoryOptions& o, int64_t n_ctx);
  CpuHistory(const CpuHistory&) = delete;
  CpuHistory& operator=(const CpuHistory&) = delete;

  kv::SequenceKv& seq() { return *seq_; }
  const kv::SequenceKv& seq() const { return *seq_; }
  /// The route the forward pass reads along; set view().report to count what decode steps read.
  route::RoutedView& view() { return view_; }
  /// nullptr for the exact formats.
  convert::CompressedHistory* compressed() { return compressed_.get(); }
  /// After a forward step: queues conversion of the pages that became full.
  void schedule();
  /// Blocks until every queued conversion has published its page (benchmarks: steady state).
  void wait();

 private:
  std::unique_ptr<kv::PageStore> store_;
  std::unique_ptr<kv::SequenceKv> seq_;
  std::unique_ptr<convert::ConversionPool> pool_;
  // After seq_: destroyed (its conversions cancelled) before seq_ frees its pages.
  std::unique_ptr<convert::CompressedHistory> compressed_;
  route::RoutedView view_;
};

}  // namespace activekv::cli
