// lossless13 attention: each page's planes are unpacked straight into the
// bf16 kernel's fp32 workspace, then the exact bf16 arithmetic of
// attend_tile runs (see attention_codecs.h).
#include <algorithm>
#include <vector>

#include "activekv/attention/attention_codecs.h"
#include "activekv/kv/codec_lossless13.h"
#include "codec_tile.h"

namespace activekv::attention {

void read_lossless13_planes(const kv::Lossless13PageView& page, int kv_head, int n_keys, float* k, float* v) {
  const size_t n = size_t(n_keys) * size_t(page.header.head_dim);
  const int v_plane = page.header.n_kv_heads + kv_head;
  // Below ~16K values a fork costs more than it saves.
#pragma omp parallel sections if (n >= 16384)
  {
#pragma omp section
    page.decode_plane(kv_head, n, k);
#pragma omp section
    page.decode_plane(v_plane, n, v);
  }
}

Partial attend_lossless13_tile(std::span<const kv::Lossless13PageView> pages, int64_t first_token,
                               int64_t history_tokens, const QueryRows& q, const AttentionOptions& opt,
                               Workspace& ws) {
  const detail::CodecTile tile = detail::check_view_tile("lossless13 attention", kv::CodecFormat::lossless13, pages,
                                                         first_token, history_tokens, q);
  const kv::PageHeader& h = tile.first;
  if (first_token % h.page_size != 0) {
    throw InvalidArgument(fmt::format("lossless13 attention: first_token {} is not a multiple of page_size {}",
                                      first_token, h.page_size));
  }
  if (tile.n_read == 0) return Partial(q.n_rows, q.n_heads, h.head_dim);
  // attend_tile reads the planes only through read_planes: the store holds
  // no page (it gives the shape), the page table's ids are never used.
  kv::KvShape shape;
  shape.n_layers = 1;
  shape.n_kv_heads = h.n_kv_heads;
  shape.head_dim = h.head_dim;
  shape.page_size = h.page_size;
  shape.format = kv::PageFormat::bf16;
  const kv::PageStore store(shape);
  const size_t first_page = size_t(first_token / h.page_size);
  // The history ends where the caller's does (history_tokens), so that rows
  // keep their positions -- a sliding window's lower bound depends on them;
  // only the tile's pages [first_page, first_page + n_read) are ever read.
  const int64_t end = std::max<int64_t>(history_tokens, first_token + 1);
  const std::vector<kv::PageId> table(size_t((end + h.page_size - 1) / h.page_size), kv::PageId{0});
  LayerHistory history{&store, table, end};
  history.read_planes = [&](size_t page, int kv_head, int n_keys, float* k, float* v) {
    read_lossless13_planes(pages[page - first_page], kv_head, n_keys, k, v);
    return true;
  };
  return attend_tile(history, first_page, tile.n_read, q, opt, ws);
}

Partial attend_lossless13_tile(std::span<const kv::EncodedPage* const> pages, int64_t first_token,
                               int64_t history_tokens, const QueryRows& q, const AttentionOptions& opt,
                               Workspace& ws) {
  const detail::CodecTile tile = detail::check_codec_tile("lossless13 attention", kv::CodecFormat::lossless13, pages,
                                                          first_token, history_tokens, q);
  std::vector<kv::Lossless13PageView> views;
  for (size_t i = 0; i < std::max<size_t>(tile.n_read, 1); ++i) {
    views.push_back(kv::parse_lossless13_page(pages[i]->bytes));
  }
  return attend_lossless13_tile(std::span<const kv::Lossless13PageView>(views), first_token, history_tokens, q, opt,
                                ws);
}

Partial attend_lossless13_tile(std::span<const kv::EncodedPage* const> pages, int64_t first_token,
                               int64_t history_tokens, const QueryRows& q, const AttentionOptions& opt) {
  Workspace ws;
  return attend_lossless13_tile(pages, first_token, history_tokens, q, opt, ws);
}

}  // namespace activekv::attention
