// Routes: which pages a step reads in which format (SPEC §2).
//
// A route gives every page the format it is read in, and cuts the pages into
// *segments* in ascending order. Tiles are fixed slices of the page table
// ([0, T), [T, 2T), ... with T = tile_pages); a tile is cut further only where
// the kernel changes. exact and lossless13 pages share the bf16 kernel
// (lossless13 decodes to the very same bf16 values), so a lossless13 route
// computes bit for bit what the exact route computes; int8s pages have their
// own kernel. Each segment yields one partial; partials merge in order.
//
// Route kinds:
//   exact       every page as stored (bf16 or f32 pages).
//   lossless13  every full, published page as lossless13; the rest exact.
//   int8s       every full, published page as int8s; the rest exact.
//   hybrid      exact for the sink (the first `sink_pages` pages, default 1),
//               the recent window (the last `recent_pages` full pages) and
//               the tail (the partly written page); int8s for the published
//               pages between.
// A page not yet published in the wanted format is always served exact.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace activekv::route {

/// The format a segment is read in.
enum class ReadFormat { exact, lossless13, int8s };

enum class RouteKind { exact, lossless13, int8s, hybrid };

struct RouteConfig {
  RouteKind kind = RouteKind::exact;
  int recent_pages = 2;  ///< hybrid: full pages before the tail kept exact
  int tile_pages = 32;   ///< max pages per segment (tile)
  int sink_pages = 1;    ///< hybrid: leading pages kept exact (the attention sink)
};

/// A route candidate (issue 11 part 5): a kind with named parameters, so that
/// `activekv eval` can measure several splits of exact vs compressed pages and
/// the gate can pick, per context, the cheapest that passes.
struct RouteCandidate {
  std::string name;    ///< canonical spec: the kind, then ":recent=N,sink=M" for each parameter given
  RouteConfig config;
};

/// Parses "KIND[:key=value[,key=value]]" with keys `recent` (hybrid's exact
/// recent pages, >= 0) and `sink` (hybrid's exact leading pages, >= 0), e.g.
/// "hybrid:recent=8,sink=2"; what the spec does not give comes from
/// `defaults` (its kind is ignored). Throws InvalidArgument naming the bad
/// part: an unknown kind or key, a value that is not a count, a parameter
/// given twice, or a parameter on a kind without it (only hybrid has them).
RouteCandidate parse_candidate(const std::string& spec, const RouteConfig& defaults);

/// A comma-separated list of candidate specs, split at every comma (as
/// `--routes a,b` arrives), joined back: a piece that is only "key=value"
/// continues the spec before it ("hybrid:recent=8", "sink=2", "int8s" ->
/// "hybrid:recent=8,sink=2", "int8s"). Throws InvalidArgument when the first
/// piece is a bare "key=value" (no spec to continue).
std::vector<std::string> join_candidate_parts(const std::vector<std::string>& parts);

/// The arithmetic a segment runs: the bf16 kernel (exact and lossless13
/// pages) or the int8s kernel.
enum class Kernel { bf16, int8s };

/// Pages [first_page, first_page + n_pages), all run by `kernel`.
struct Segment {
  Kernel kernel = Kernel::bf16;
  size_t first_page = 0;
  size_t n_pages = 0;
};

/// The formats of every used page and the segments, in ascending order.
/// Pages before first_page (outside a sliding window) are not read: no
/// segment covers them and RouteReport does not count them.
struct RoutePlan {
  std::vector<ReadFormat> page_format;  ///< [n_pages used]; exact (unused) before first_page
  std::vector<Segment> segments;
  size_t first_page = 0;
};

/// Tells whether page `page` of the layer is published in `format`.
using PublishedFn = std::function<bool(size_t page, ReadFormat format)>;

/// Plans the route over a layer history of `n_tokens` tokens in pages of
/// `page_size`, reading pages from `first_page` on (a sliding-window layer's
/// first visible page, attention::first_visible_page; clamped to the pages
/// used). Segments keep the tile grid ([0, T), [T, 2T), ...). Throws
/// InvalidArgument for non-positive page_size or tile_pages, or negative
/// recent_pages / sink_pages / n_tokens.
RoutePlan plan_route(const RouteConfig& cfg, int64_t n_tokens, int page_size, const PublishedFn& published,
                     size_t first_page = 0);

/// The route a layer is read along: `cfg` for a layer over the whole
/// history (window 0), the exact route (same tiles) for a sliding-window
/// layer (window > 0). Why: on the GPU a sliding layer's last `window` tokens
/// stay resident in a ring (issue 11 part 2) and never cross the bus, so a
/// compressed format would save no transfer there and only cost quality; the
/// CPU forward (LlamaModel) and `activekv eval` read such layers through this
/// function too, so CPU, GPU and the quality contract measure one thing.
RouteConfig layer_route(const RouteConfig& cfg, int64_t window);

/// The format a route kind wants for a compressed page ("exact" has none).
ReadFormat compressed_format(RouteKind kind);

/// "exact", "lossless13", "int8s", "hybrid"; parse throws InvalidArgument.
std::string kind_name(RouteKind kind);
RouteKind parse_kind(const std::string& name);
std::string format_name(ReadFormat f);

/// What a step read: pages per format, segments per kernel, and bytes.
struct RouteReport {
  size_t pages[3] = {0, 0, 0};  ///< indexed by ReadFormat
  size_t segments[2] = {0, 0};  ///< indexed by Kernel
  double bytes = 0;             ///< history bytes read (all layers added)
  void add(const RoutePlan& plan);
  /// Of the pages read, the share read compressed (lossless13 or int8s); 0 if none read.
  double compressed_fraction() const;
};

}  // namespace activekv::route
