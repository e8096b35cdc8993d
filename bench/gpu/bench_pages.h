// Internal to the GPU bench: the synthetic host history in every page format
// (random bf16 pages in the one page store, pinned, then their int8s and
// lossless13 encodings made with the CPU codecs on host threads and put in
// the store's arena, as background conversion would publish them), and the
// page tables of each route over it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "activekv/cuda/decode_engine.h"
#include "activekv/kv/page_store.h"

namespace activekv::gpu_bench {

using cuda::AttnShape;
using cuda::PageKind;
using cuda::PageRef;
using cuda::SeqPages;

/// Page refs [seq][layer][page] of one stored format.
using PageGrid = std::vector<std::vector<std::vector<PageRef>>>;

struct HistorySet {
  std::unique_ptr<kv::PageStore> store;  ///< pinned; bf16 pages in slots, encoded pages in blobs()
  PageGrid bf16, int8s, lossless13;  ///< int8s / lossless13 empty when not built
  /// Conversion measured while building: pages, seconds and host threads used.
  struct Conversion { size_t pages = 0; double seconds = 0; int threads = 0; };
  Conversion int8s_conv, lossless13_conv;
};

/// Pins and fills `max_batch` sequences x `n_layers` x ceil(max_ctx / page)
/// bf16 pages (random, fixed seed) in a bounded pinned page store, allocated
/// sequence by sequence, layer by layer (each layer has its region), so a
/// (sequence, layer)'s pages are adjacent and stream as one copy; then
/// encodes every full page to int8s and/or lossless13 into the store's arena,
/// page-ordered per (sequence, layer) so a tile's pages are back to back
/// (within a chunk of the arena). Prints progress. Throws Error naming the
/// bytes when the history cannot be pinned.
HistorySet build_history(const AttnShape& sh, int n_layers, int max_batch, int64_t max_ctx, bool want_int8s,
                         bool want_lossless13, int threads);

/// Route names accepted by route_tables.
const std::vector<std::string>& route_names();

/// Page tables for `batch` sequences of `ctx` tokens read along `route`, as
/// route::plan_route plans it with every full page published: "bf16" every
/// page exact; "lossless13" / "int8s" every full page in that format, the
/// tail exact; "hybrid" the sink, the last `recent_pages` full pages and the
/// tail exact, int8s between (SPEC §2). Throws InvalidArgument for an
/// unknown route or one whose encodings were not built.
std::vector<SeqPages> route_tables(const HistorySet& h, const std::string& route, int batch, int64_t ctx,
                                   int n_layers, int page_size, int recent_pages);

}  // namespace activekv::gpu_bench
