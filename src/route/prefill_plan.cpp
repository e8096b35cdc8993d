#include "activekv/route/prefill_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "activekv/core/error.h"

namespace activekv::route {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
/// "52.0 KiB", "3.5 MiB", "1.25 GiB": a budget of a few pages (a tiny
/// model's) read "0.0 MiB" in MiB alone.
std::string size_text(size_t b) {
  if (b < (size_t(1) << 20)) return fmt::format("{:.1f} KiB", double(b) / 1024.0);
  if (b < (size_t(1) << 30)) return fmt::format("{:.1f} MiB", double(b) / double(1ull << 20));
  return fmt::format("{:.2f} GiB", double(b) / double(1ull << 30));
}

void check(const PrefillPlanInput& in) {
  if (in.page_bytes == 0 || in.page_size <= 0 || in.n_layers <= 0 || in.pos0 < 0 || in.n_tokens <= 0 ||
      in.chunk <= 0 || in.stream_chunk <= 0)
    throw InvalidArgument(fmt::format("plan_prefill: bad input (page {} B of {} tokens, {} layers, pos0 {}, {} tokens, "
                                      "chunk {}, stream chunk {})",
                                      in.page_bytes, in.page_size, in.n_layers, in.pos0, in.n_tokens, in.chunk,
                                      in.stream_chunk));
}

// The streamed plan with chunks of `chunk` tokens, or staging_pages < 0 when
// its minimum does not fit.
PrefillPlan streamed_plan(const PrefillPlanInput& in, int chunk) {
  PrefillPlan p;
  p.streamed = true;
  p.chunk = chunk;
  const size_t layer_page = in.page_bytes * size_t(in.n_layers);
  p.chunk_pages = pages_spanned(std::min<int64_t>(chunk, in.n_tokens), in.page_size);
  const int64_t last_start = in.pos0 + (in.n_tokens - 1) / chunk * chunk;
  p.history_pages = last_start / in.page_size;
  const size_t fixed = in.tail_bytes + size_t(p.chunk_pages) * layer_page;
  const int64_t min_staging = p.history_pages > 0 ? 1 : 0;
  if (fixed + 2 * size_t(min_staging) * in.page_bytes > in.budget_bytes) {
    p.staging_pages = -1;
    p.device_bytes = fixed - in.tail_bytes + 2 * size_t(min_staging) * in.page_bytes;
    return p;
  }
  p.staging_pages = std::min<int64_t>(p.history_pages, int64_t((in.budget_bytes - fixed) / (2 * in.page_bytes)));
  p.whole_layer = p.staging_pages >= p.history_pages;
  p.device_bytes = size_t(p.chunk_pages) * layer_page + 2 * size_t(p.staging_pages) * in.page_bytes;
  p.moved_bytes = streamed_prefill_bytes(in.pos0, in.n_tokens, chunk, in.page_size, in.page_bytes, in.n_layers);
  return p;
}

}  // namespace

int64_t pages_spanned(int64_t tokens, int page_size) {
  if (tokens <= 0 || page_size <= 0) throw InvalidArgument("pages_spanned: tokens and page_size must be positive");
  return ceil_div(tokens - 1, page_size) + 1;  // the first token at the last slot of a page
}

int64_t history_segments(int64_t history_pages, int64_t staging_pages) {
  if (history_pages <= 0) return 0;
  if (staging_pages <= 0) throw InvalidArgument("history_segments: no staging pages for a history");
  return ceil_div(history_pages, staging_pages);
}

size_t streamed_prefill_bytes(int64_t pos0, int64_t n_tokens, int chunk, int page_size, size_t page_bytes,
                              int n_layers) {
  size_t pages = 0;
  for (int64_t s = pos0; s < pos0 + n_tokens; s += chunk) pages += size_t(s / page_size);
  return pages * page_bytes * size_t(n_layers);
}

PrefillPlan plan_prefill(const PrefillPlanInput& in) {
  check(in);
  const size_t layer_page = in.page_bytes * size_t(in.n_layers);
  const size_t resident = size_t(ceil_div(in.pos0 + in.n_tokens, in.page_size)) * layer_page;
  if (in.allow_resident && in.tail_bytes + resident <= in.budget_bytes) {
    PrefillPlan p;
    p.chunk = in.chunk;
    p.device_bytes = resident;
    return p;
  }
  // The largest chunk whose minimum fits: halve the streamed chunk down to the resident one.
  for (int chunk = std::max(in.stream_chunk, in.chunk);; chunk = std::max(chunk / 2, in.chunk)) {
    const PrefillPlan p = streamed_plan(in, chunk);
    if (p.staging_pages >= 0) return p;
    if (chunk == in.chunk)
      throw Error(fmt::format(
          "prefill: the prompt's history ({} for {} tokens) does not fit the GPU budget of {}, and streaming it "
          "needs at least {} ({} of decode tail pages + {} pages per layer for a chunk of {} tokens + 2 staging "
          "pages, {} a page); raise --gpu-kv-mem or lower --prefill-chunk",
          size_text(resident), in.pos0 + in.n_tokens, size_text(in.budget_bytes),
          size_text(in.tail_bytes + p.device_bytes), size_text(in.tail_bytes), p.chunk_pages, chunk,
          size_text(in.page_bytes)));
  }
}

int choose_stream_chunk(int base, int64_t n_tokens, size_t row_bytes, size_t spare_bytes) {
  if (base <= 0) throw InvalidArgument("choose_stream_chunk: base chunk must be positive");
  int chunk = base;
  while (int64_t(chunk) * 2 <= kMaxStreamChunk && chunk < n_tokens &&
         size_t(chunk * 2 - base) * row_bytes <= spare_bytes)
    chunk *= 2;
  return chunk;
}

}  // namespace activekv::route
