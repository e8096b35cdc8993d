// lossless13 attention: unpack to bf16, then the exact bf16 arithmetic of
// attend_tile (see attention_codecs.h).
#include <algorithm>
#include <vector>

#include "activekv/attention/attention_codecs.h"
#include "activekv/kv/codec_lossless13.h"
#include "codec_tile.h"

namespace activekv::attention {

Partial attend_lossless13_tile(std::span<const kv::EncodedPage* const> pages, int64_t first_token,
                               int64_t history_tokens, const QueryRows& q, const AttentionOptions& opt,
                               Workspace& ws) {
  const detail::CodecTile tile = detail::check_codec_tile("lossless13 attention", kv::CodecFormat::lossless13, pages,
                                                          first_token, history_tokens, q);
  const kv::PageHeader& h = tile.first;
  if (first_token % h.page_size != 0) {
    throw InvalidArgument(fmt::format("lossless13 attention: first_token {} is not a multiple of page_size {}",
                                      first_token, h.page_size));
  }
  kv::KvShape shape;
  shape.n_layers = 1;
  shape.n_kv_heads = h.n_kv_heads;
  shape.head_dim = h.head_dim;
  shape.page_size = h.page_size;
  shape.format = kv::PageFormat::bf16;
  const size_t n_read = std::max<size_t>(tile.n_read, 1);
  kv::PageStore store(shape, n_read);
  std::vector<kv::PageId> ids;
  for (size_t i = 0; i < n_read; ++i) {
    const kv::PageId id = store.allocate();
    if (i < tile.n_read) {
      auto* base = reinterpret_cast<bf16*>(store.k_plane(id, 0));
      kv::decode_lossless13_page(*pages[i], std::span<bf16>(base, shape.page_elements()));
    }
    ids.push_back(id);
  }
  // Page table indexed like the original history: entries before the tile are
  // never read (attend_tile starts at first_page), so they repeat the first id.
  const size_t first_page = size_t(first_token / h.page_size);
  std::vector<kv::PageId> table(first_page, ids[0]);
  table.insert(table.end(), ids.begin(), ids.end());
  // Rows past the tile see all of it: clamping their positions to the tile's
  // last token leaves every visibility limit (and so every operation) unchanged.
  const int64_t end = std::max<int64_t>(tile.end, first_token + 1);
  std::vector<int64_t> pos(q.positions, q.positions + q.n_rows);
  for (int64_t& p : pos) p = std::min(p, end - 1);
  const LayerHistory history{&store, table, end};
  const QueryRows rows{q.q, q.n_rows, q.n_heads, pos.data()};
  if (tile.n_read == 0) return Partial(q.n_rows, q.n_heads, h.head_dim);
  return attend_tile(history, first_page, tile.n_read, rows, opt, ws);
}

Partial attend_lossless13_tile(std::span<const kv::EncodedPage* const> pages, int64_t first_token,
                               int64_t history_tokens, const QueryRows& q, const AttentionOptions& opt) {
  Workspace ws;
  return attend_lossless13_tile(pages, first_token, history_tokens, q, opt, ws);
}

}  // namespace activekv::attention
