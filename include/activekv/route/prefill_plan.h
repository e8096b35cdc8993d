// Where a prompt's history lives on the GPU while prefill runs (issue "One
// runtime", item 6). Pure host arithmetic: tested without a GPU.
//
//   resident  every page of the prompt gets a device copy for the whole
//             prefill (each chunk attends to earlier pages in place); chosen
//             when the prompt's pages plus the decode tail pages fit the GPU
//             budget.
//   streamed  only the pages the current chunk writes live on the GPU; each
//             chunk's attention reads, per layer, the layer's earlier pages
//             from the pinned host store through a device staging area of two
//             buffers (one is copied into while the other is attended). A
//             buffer holds `staging_pages` pages: when that covers the longest
//             history a chunk reads (whole_layer), the attention is the
//             resident call over the staged copies -- bitwise the resident
//             result; otherwise the history is attended in segments of
//             staging_pages pages whose (O, LSE) partials merge exactly
//             (SPEC §4), equal to the resident result within rounding.
//
// The budget is the one placement uses (--gpu-kv-mem, or free memory less a
// margin): device pages of the history -- decode tail pages, the chunk's
// pages, staging -- stay within it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace activekv::route {

struct PrefillPlanInput {
  size_t budget_bytes = 0;  ///< GPU budget for the history's device pages
  size_t page_bytes = 0;    ///< one page (K and V of every KV head), bf16
  int page_size = 0;        ///< tokens per page
  int n_layers = 0;
  size_t tail_bytes = 0;    ///< device bytes already held for decode (each layer's tail page)
  int64_t pos0 = 0;         ///< tokens already in the history
  int64_t n_tokens = 0;     ///< tokens the prefill appends (> 0)
  int chunk = 0;            ///< tokens per chunk when resident (> 0)
  int stream_chunk = 0;     ///< tokens per chunk when streamed (> 0; see choose_stream_chunk)
  bool allow_resident = true;  ///< false: streamed even when it fits (the resident pages could not be had)
};

struct PrefillPlan {
  bool streamed = false;
  int chunk = 0;                  ///< tokens per prefill chunk
  int64_t chunk_pages = 0;        ///< streamed: device pages per layer a chunk writes (worst case)
  int64_t history_pages = 0;      ///< streamed: most pages of one layer a chunk reads from the host
  int64_t staging_pages = 0;      ///< streamed: pages per staging buffer (two buffers)
  bool whole_layer = false;       ///< streamed: a buffer holds the longest layer history
  size_t device_bytes = 0;        ///< device bytes the plan adds (prompt pages, or chunk pages + staging)
  size_t moved_bytes = 0;         ///< streamed: host -> device bytes the prefill copies (all chunks)
};

/// Most pages that `tokens` (> 0) consecutive tokens touch, wherever they start.
int64_t pages_spanned(int64_t tokens, int page_size);

/// Segments of at most `staging_pages` pages that cover `history_pages` (0 if none).
int64_t history_segments(int64_t history_pages, int64_t staging_pages);

/// Host -> device bytes a streamed prefill moves: for each chunk (starting at
/// pos0, pos0 + chunk, ... below pos0 + n_tokens), the full pages before the
/// page the chunk starts in, in every layer.
size_t streamed_prefill_bytes(int64_t pos0, int64_t n_tokens, int chunk, int page_size, size_t page_bytes,
                              int n_layers);

/// Resident when pos0 + n_tokens tokens' pages (all layers) plus tail_bytes
/// fit the budget (and allow_resident); streamed otherwise, with the largest staging buffers the
/// budget leaves (never more than the longest history). Throws
/// InvalidArgument for bad input and Error, naming the sizes, when even
/// streaming's minimum (tail pages, the chunk's pages, two staging pages)
/// does not fit.
PrefillPlan plan_prefill(const PrefillPlanInput& in);

/// Tokens per chunk when the history streams. Every chunk re-reads the whole
/// earlier history over PCIe, so a prompt of N tokens moves about
/// N^2 / (2 chunk) tokens' pages: doubling the chunk halves the bytes moved,
/// while the forward's workspace grows by `row_bytes` per row. Doubles `base`
/// (the resident chunk) up to kMaxStreamChunk, stopping once a chunk covers
/// the prompt (`n_tokens`) or the extra workspace would pass `spare_bytes`.
/// Returns base when base >= kMaxStreamChunk. Throws InvalidArgument for base <= 0.
int choose_stream_chunk(int base, int64_t n_tokens, size_t row_bytes, size_t spare_bytes);

/// The largest streamed chunk choose_stream_chunk picks. At 2048 rows the
/// chunk's attention does 2048 x group >= 4096 flop per streamed byte (GQA
/// group >= 2): about what an H200 computes (~200 Tflop/s effective with two
/// bf16 terms) per byte PCIe 5 delivers (~55 GB/s), so the copies hide behind
/// compute and larger chunks would save bytes, not time, for more workspace.
inline constexpr int kMaxStreamChunk = 2048;

}  // namespace activekv::route
