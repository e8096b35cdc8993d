// Attention over compressed pages (SPEC §3.2, §3.3, §4), CPU versions of the
// kernels the GPU will run: they read the encoded pages directly.
//
// Common contract. `pages[i]` holds tokens [first_token + i * page_size,
// first_token + (i + 1) * page_size) of one layer; only tokens below
// `history_tokens` (the number of tokens written in the whole history, an
// absolute position bound) are read, so a tile's last page may be partial.
// Query rows attend causally (row at position p sees keys at positions <= p;
// rows before the tile are empty: LSE = -inf). GQA: query head h uses KV head
// h / (n_heads / n_kv_heads). Returns the tile's Partial
// O [n_rows][n_heads][head_dim] fp32 normalised, LSE [n_rows][n_heads] fp32.
// softmax_scale 0 means 1/sqrt(head_dim). opt.tile_pages is not used (the
// caller chose the tile).
//
// Errors: InvalidArgument for no pages, a null page, pages whose dimensions
// differ, query heads not a multiple of KV heads, a position outside
// [0, history_tokens), or a page holding fewer tokens than the tile needs;
// activekv::Error (from the codec) for a page that does not validate.
//
// Two entry points per format. Over blobs (kv::EncodedPage): every page the
// tile reads is validated (header, checksum, metadata) before any value is
// used -- for pages of unknown provenance. Over views (kv::Int8sPageView,
// kv::Lossless13PageView): the pages were validated once when they were
// parsed (convert::CompressedHistory does it when it publishes a page), and
// the kernel checks only the tile geometry from their headers -- the path
// decode takes every step. Both give bitwise identical results.
#pragma once

#include <cstdint>
#include <span>

#include "activekv/attention/paged_attention.h"
#include "activekv/attention/partial.h"
#include "activekv/kv/codec.h"
#include "activekv/kv/codec_int8s.h"
#include "activekv/kv/codec_lossless13.h"

namespace activekv::attention {

/// int8s attention computed the way the GPU kernel computes it. Per page, KV
/// head and query head row:
///   q'_j = q_j * c_j (fp32; the channel scale folded into the query);
///   a = max_j |q'_j| / 127; qq_j = clip(round_half_even(q'_j / a), +-127)
///   (int8, one scale per row and page; a = 0 gives qq = 0);
///   dot_t = sum_j qq_j * kq[t, j]  (exact int32);
///   score_t = (float(dot_t) * s_t) * (a * softmax_scale)   (fp32).
/// Online softmax across pages in fp32 (running max m, denominator l). P·V runs
/// on the raw value codes: u_j = sum_t p_t * vq[t, j]; the page's value scale
/// enters once per page and channel: acc_j = acc_j * alpha + v_j * u_j, with
/// alpha = exp(m_old - m_new). This is the SPEC's "rescale the accumulator by
/// v_old / v_new at each page boundary, restore with the last page's scale"
/// in the algebraically identical form that keeps acc in physical units (no
/// division, so a zero value scale needs no special case). Value scales never
/// touch scores, m, l or LSE. O = acc / l, LSE = m + log l.
/// Deterministic: each (row, head) is computed serially in token order.
Partial attend_int8s_tile(std::span<const kv::EncodedPage* const> pages, int64_t first_token,
                          int64_t history_tokens, const QueryRows& q, const AttentionOptions& opt);
/// Same over validated views (no validation; see the file comment).
Partial attend_int8s_tile(std::span<const kv::Int8sPageView> pages, int64_t first_token, int64_t history_tokens,
                          const QueryRows& q, const AttentionOptions& opt);

/// lossless13 attention: unpacks each page's planes (exact fp32 widening of
/// the stored bf16, straight into the workspace) and runs exactly the bf16
/// arithmetic of attend_tile, so the result is bitwise identical to
/// attend_tile over the original bf16 pages of the same tile (same
/// first_page = first_token / page_size and n_pages). first_token must be a
/// multiple of the page size (InvalidArgument otherwise).
Partial attend_lossless13_tile(std::span<const kv::EncodedPage* const> pages, int64_t first_token,
                               int64_t history_tokens, const QueryRows& q, const AttentionOptions& opt,
                               Workspace& ws);
/// Same over validated views (no validation; see the file comment).
Partial attend_lossless13_tile(std::span<const kv::Lossless13PageView> pages, int64_t first_token,
                               int64_t history_tokens, const QueryRows& q, const AttentionOptions& opt,
                               Workspace& ws);
/// Unpacks K and V of `kv_head` (first n_keys tokens) of a validated
/// lossless13 page to fp32 (exact): the LayerHistory::read_planes body for a
/// lossless13 page, shared by attend_lossless13_tile and the routed reader.
/// The two planes unpack on two OpenMP threads when there is enough work.
void read_lossless13_planes(const kv::Lossless13PageView& page, int kv_head, int n_keys, float* k, float* v);

/// Same over blobs, with a call-local workspace.
Partial attend_lossless13_tile(std::span<const kv::EncodedPage* const> pages, int64_t first_token,
                               int64_t history_tokens, const QueryRows& q, const AttentionOptions& opt);

}  // namespace activekv::attention
