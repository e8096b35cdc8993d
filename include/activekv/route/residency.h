// Partial residency (issue 12 part 3): when the GPU budget holds only part of
// the history, which pages keep a device copy (resident: HBM time, no link
// bytes) and which stream from pinned host memory (or go to the host CPU,
// co-attention). Pure host arithmetic, tested without a GPU.
//
// Preference, per layer (every layer alike): the tail (the page being
// written: the GPU writes it, so it always has a device copy, even past the
// budget), the sink pages (the first `sink_pages`), the recent window (the
// last `recent_pages` full pages, newest first), then every other page newest
// first. Why newest first: co-attention gives the host CPU the oldest pages,
// and the streamed remainder stays one run of adjacent host pages (fewer,
// larger copies). A page costs the device bytes of the format the route reads
// it in this step: a bf16 page its page bytes, a published int8s page its
// encoded bytes (about half). A page that does not fit what is left is
// skipped; a smaller one after it may still fit.
//
// The runtime sizes its device pools once, for the route's steady state at the
// full context (plan_residency: every full page published), and re-chooses
// every step with choose_resident_pages under those pools' slot counts (a
// page read bf16 before it is published may not find a bf16 slot: it streams
// until its encoded copy is resident).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "activekv/route/route.h"

namespace activekv::route {

/// One page of a layer as the route reads it this step (oldest first; the
/// last one is the tail).
struct ResidencyPage {
  uint64_t bytes = 0;    ///< device bytes its copy takes: the bf16 page, or the encoded page the route reads
  bool encoded = false;  ///< read in a compressed format (its copy is an encoded one)
};

/// What one layer's resident pages may take.
struct ResidencyLimits {
  uint64_t bytes = 0;  ///< device bytes, the tail included
  size_t bf16_slots = std::numeric_limits<size_t>::max();     ///< full pages read bf16 (the tail not counted)
  size_t encoded_slots = std::numeric_limits<size_t>::max();  ///< pages read encoded
};

/// Flags [pages.size()]: which pages of one layer stay resident, in the order
/// of preference above. The tail (the last page) is always resident. Throws
/// InvalidArgument for negative sink_pages or recent_pages.
std::vector<bool> choose_resident_pages(std::span<const ResidencyPage> pages, int sink_pages, int recent_pages,
                                        const ResidencyLimits& limits);

/// Device memory of partial residency for a context, per layer.
struct ResidencyPlan {
  size_t layer_pages = 0;        ///< pages per layer at the full context
  size_t resident_pages = 0;     ///< of them resident at the steady state, the tail included
  size_t bf16_slots = 0;         ///< full bf16 pages resident (the tail not counted): the bf16 pool, per layer
  size_t encoded_slots = 0;      ///< encoded pages resident: the encoded pool, per layer
  uint64_t resident_bytes = 0;   ///< device bytes of the resident pages, the tail included
  uint64_t history_bytes = 0;    ///< device bytes every page would take in the format the route reads it
  /// "12 of 40 pages per layer resident (tail, sink, 2 recent, 8 others; 24.0 of 80.0 MiB)"
  std::string describe() const;
};

/// Sizes partial residency for `n_ctx` tokens in pages of `page_size`, in
/// the route's steady state (every full page published): each of `n_layers`
/// layers gets budget_bytes / n_layers. `page_bytes`: a bf16 page;
/// `encoded_bytes`: a page in the route's compressed format (ignored for the
/// exact route). Throws InvalidArgument for non-positive sizes or counts, or
/// an encoded route with encoded_bytes 0.
ResidencyPlan plan_residency(const RouteConfig& route, int64_t n_ctx, int page_size, int n_layers,
                             uint64_t page_bytes, uint64_t encoded_bytes, uint64_t budget_bytes);

}  // namespace activekv::route
