// Internal: argument checks shared by the compressed-page attention kernels.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <span>

#include "activekv/attention/paged_attention.h"
#include "activekv/core/error.h"
#include "activekv/kv/codec.h"

namespace activekv::attention::detail {

/// Geometry of a tile of encoded pages, validated against the query rows.
struct CodecTile {
  kv::PageHeader first;  ///< header of pages[0]
  int64_t end = 0;       ///< one past the last token the tile reads (absolute)
  size_t n_read = 0;     ///< pages holding tokens below `end`
};

/// Checks the tile from its pages' headers (same format and dimensions,
/// enough tokens) and the rows (positions in [0, history_tokens), heads a
/// multiple of KV heads). `header_of(i)` gives page i's header; it is called
/// only for the pages the tile reads.
template <class HeaderOf>
CodecTile check_tile(const char* what, kv::CodecFormat format, size_t n_pages, const HeaderOf& header_of,
                     int64_t first_token, int64_t history_tokens, const QueryRows& q) {
  if (n_pages == 0) throw InvalidArgument(fmt::format("{}: no pages", what));
  if (first_token < 0) throw InvalidArgument(fmt::format("{}: first_token {} is negative", what, first_token));
  CodecTile tile;
  tile.first = header_of(size_t(0));
  const kv::PageHeader& h0 = tile.first;
  const int64_t P = h0.page_size;
  tile.end = std::min<int64_t>(history_tokens, first_token + int64_t(n_pages) * P);
  tile.n_read = tile.end > first_token ? size_t((tile.end - first_token + P - 1) / P) : 0;
  for (size_t i = 0; i < tile.n_read; ++i) {
    const kv::PageHeader h = i == 0 ? h0 : header_of(i);
    if (h.format != format) {
      throw InvalidArgument(fmt::format("{}: page {} is {}, expected {}", what, i, kv::codec_name(h.format),
                                        kv::codec_name(format)));
    }
    if (h.page_size != h0.page_size || h.n_kv_heads != h0.n_kv_heads || h.head_dim != h0.head_dim) {
      throw InvalidArgument(fmt::format("{}: page {} dimensions ({}, {}, {}) differ from page 0 ({}, {}, {})", what,
                                        i, h.page_size, h.n_kv_heads, h.head_dim, h0.page_size, h0.n_kv_heads,
                                        h0.head_dim));
    }
    const int64_t need = std::min<int64_t>(P, tile.end - (first_token + int64_t(i) * P));
    if (h.n_tokens < need) {
      throw InvalidArgument(fmt::format("{}: page {} holds {} tokens, the tile needs {}", what, i, h.n_tokens, need));
    }
  }
  if (q.n_heads <= 0 || q.n_heads % h0.n_kv_heads != 0) {
    throw InvalidArgument(fmt::format("{}: {} query heads is not a multiple of {} KV heads", what, q.n_heads,
                                      h0.n_kv_heads));
  }
  for (int r = 0; r < q.n_rows; ++r) {
    if (q.positions[r] < 0 || q.positions[r] >= history_tokens) {
      throw InvalidArgument(fmt::format("{}: row {} position {} outside history of {} tokens", what, r,
                                        q.positions[r], history_tokens));
    }
  }
  return tile;
}

/// check_tile over blobs: pages must be non-null; reads each needed page's
/// header (with its checksum).
inline CodecTile check_codec_tile(const char* what, kv::CodecFormat format,
                                  std::span<const kv::EncodedPage* const> pages, int64_t first_token,
                                  int64_t history_tokens, const QueryRows& q) {
  for (size_t i = 0; i < pages.size(); ++i) {
    if (pages[i] == nullptr) throw InvalidArgument(fmt::format("{}: page {} is null", what, i));
  }
  return check_tile(
      what, format, pages.size(), [&](size_t i) { return kv::read_header(pages[i]->bytes); }, first_token,
      history_tokens, q);
}

/// check_tile over validated views (their headers; nothing is re-validated).
template <class View>
CodecTile check_view_tile(const char* what, kv::CodecFormat format, std::span<const View> pages,
                          int64_t first_token, int64_t history_tokens, const QueryRows& q) {
  return check_tile(
      what, format, pages.size(), [&](size_t i) { return pages[i].header; }, first_token, history_tokens, q);
}

}  // namespace activekv::attention::detail
