// Exact decode/prefill attention over the paged history (CPU reference).
//
// Query rows attend causally: a row at absolute position p sees the keys at
// positions <= p -- and, with a sliding window W (AttentionOptions::window,
// Gemma 3's local layers), only those at positions > p - W, the last W tokens. GQA: query head h uses KV head h / (n_heads / n_kv_heads),
// and each KV head's K/V plane is read once for all the query heads of its group.
//
// The history is split into *tiles* of `tile_pages` pages (SPEC §2). Each tile
// yields a Partial (O, LSE) by an online softmax over its pages; tile partials
// are merged in ascending order with attention::merge (SPEC §4). Within a
// tile, each page costs two fp32 GEMMs (S = Q·K^T, O += P·V) through OpenBLAS
// after widening the page's planes (bf16 or f32) to fp32.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "activekv/attention/partial.h"
#include "activekv/kv/page_store.h"

namespace activekv::attention {

/// A block of query rows. q: [n_rows][n_heads][head_dim] fp32 (RoPE applied).
/// positions: [n_rows] absolute token positions, each < the history length.
struct QueryRows {
  const float* q = nullptr;
  int n_rows = 0;
  int n_heads = 0;
  const int64_t* positions = nullptr;
};

/// The readable history of one layer: its page table and how many tokens of
/// it are written (tokens [0, n_tokens)).
struct LayerHistory {
  const kv::PageStore* store = nullptr;
  std::span<const kv::PageId> page_table;
  int64_t n_tokens = 0;
  /// Optional: supplies the K and V planes of (page index, KV head) instead
  /// of the store -- e.g. a page read from its lossless13 encoding, whose
  /// values are the stored bf16 values bit for bit. Writes n_keys*head_dim
  /// fp32 values to k and to v; returns false to fall back to the store.
  std::function<bool(size_t page, int kv_head, int n_keys, float* k, float* v)> read_planes = {};
};

struct AttentionOptions {
  float softmax_scale = 0.0f;  ///< multiplies q·k; 0 means 1/sqrt(head_dim)
  int tile_pages = 32;         ///< pages per tile (SPEC default 32)
  /// int8s kernels: int8 terms the channel-scaled query is split into. 1 is
  /// SPEC §3.3 as written (one int8 code per channel, one scale per row and
  /// page); 2 adds the rounding residual as a second int8 code on a 127x finer
  /// grid -- two integer dot products, ~127x less query rounding error.
  int int8s_query_terms = 2;
  /// Sliding window in tokens: a row at position p sees keys in (p - window, p].
  /// 0 means the whole causal history. Pages wholly before every row's window
  /// are not read at all (first_visible_page).
  int64_t window = 0;
};

/// The first token any of `q`'s rows may see under `window` (0 without one):
/// min over rows of max(0, position - window + 1).
int64_t first_visible_token(const QueryRows& q, int64_t window);
/// The page holding first_visible_token (pages before it are out of every
/// row's window and are skipped by attend and route::attend_routed).
size_t first_visible_page(const QueryRows& q, int64_t window, int page_size);

/// Reusable scratch buffers, so a decode step allocates nothing once warm.
struct Workspace {
  std::vector<float> q_group, k, v, scores, acc, row_max, row_sum;
  std::vector<int64_t> key_limit;  ///< per query row: last visible key of the current page
  std::vector<int64_t> key_first;  ///< per query row: first visible key of the current page (window)
};

/// Attention of `q` over pages [first_page, first_page + n_pages) of `history`.
/// Returns the tile's Partial [n_rows][n_heads][head_dim]; rows that see no key
/// of the tile are empty (LSE = -inf). Throws InvalidArgument on shape mismatch.
Partial attend_tile(const LayerHistory& history, size_t first_page, size_t n_pages,
                    const QueryRows& q, const AttentionOptions& opt, Workspace& ws);

/// Attention over the whole history (from first_visible_page on): one partial
/// per tile, merged in ascending tile order. With one tile the result is that tile's partial
/// unchanged (no merge arithmetic).
Partial attend(const LayerHistory& history, const QueryRows& q, const AttentionOptions& opt,
               Workspace& ws);

}  // namespace activekv::attention
