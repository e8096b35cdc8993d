// Routes: which pages a step reads in which format (SPEC §2).
//
// A route is a list of *segments* in ascending page order; each segment is at
// most `tile_pages` consecutive pages read in one format, so it is also one
// attention tile and yields one partial. Partials merge in segment order.
//
// Route kinds:
//   exact       every page as stored (bf16 or f32 pages).
//   lossless13  every full, published page as lossless13; the rest exact.
//   int8s       every full, published page as int8s; the rest exact.
//   hybrid      exact for the sink (page 0), the recent window (the last
//               `recent_pages` full pages) and the tail (the partly written
//               page); int8s for the published pages between.
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
};

/// Pages [first_page, first_page + n_pages) read in `format`.
struct Segment {
  ReadFormat format = ReadFormat::exact;
  size_t first_page = 0;
  size_t n_pages = 0;
};

/// Tells whether page `page` of the layer is published in `format`.
using PublishedFn = std::function<bool(size_t page, ReadFormat format)>;

/// Plans the route over a layer history of `n_tokens` tokens in pages of
/// `page_size`. Throws InvalidArgument for non-positive page_size or
/// tile_pages, or negative recent_pages / n_tokens.
std::vector<Segment> plan_route(const RouteConfig& cfg, int64_t n_tokens, int page_size,
                                const PublishedFn& published);

/// The format a route kind wants for a compressed page ("exact" has none).
ReadFormat compressed_format(RouteKind kind);

/// "exact", "lossless13", "int8s", "hybrid"; parse throws InvalidArgument.
std::string kind_name(RouteKind kind);
RouteKind parse_kind(const std::string& name);
std::string format_name(ReadFormat f);

/// What a step read: pages and tiles per format, and bytes.
struct RouteReport {
  size_t pages[3] = {0, 0, 0};  ///< indexed by ReadFormat
  size_t tiles[3] = {0, 0, 0};
  double bytes = 0;             ///< history bytes read (all layers added)
  void add(const std::vector<Segment>& segments);
};

}  // namespace activekv::route
