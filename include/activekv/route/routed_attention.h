// Attention over a layer's history along a route (SPEC §2, §4): each segment
// of the route is one tile read in its format -- exact bf16/f32 pages through
// attention::attend_tile, published compressed pages through the codec
// kernels that read the codes directly -- and the tile partials merge in
// ascending order. With the exact route this is attention::attend exactly
// (same tiles, same merge), so results are bitwise identical to it.
#pragma once

#include <functional>
#include <span>

#include "activekv/attention/paged_attention.h"
#include "activekv/convert/compressed_history.h"
#include "activekv/route/route.h"

namespace activekv::route {

/// Computes one int8s tile with the contract of attention::attend_int8s_tile
/// over pages validated at publication (views, first_token, history_tokens,
/// q, opt) -- e.g. the GPU kernel (cuda::Int8sTileRunner) in place of the CPU one.
using Int8sTileFn = std::function<attention::Partial(std::span<const kv::Int8sPageView>, int64_t, int64_t,
                                                     const attention::QueryRows&, const attention::AttentionOptions&)>;

/// What a forward pass needs to read the history along a route.
struct RoutedView {
  convert::CompressedHistory* compressed = nullptr;  ///< nullptr: everything exact
  RouteConfig config;                                      ///< kind, recent window, tile size
  RouteReport* report = nullptr;                           ///< if set, accumulates pages/tiles/bytes
  Int8sTileFn int8s_tile = {};                             ///< empty: attention::attend_int8s_tile (CPU)
  /// Rows over bf16 pages run the in-place CPU kernels instead of
  /// attention::attend_tile (no fp32 copy of the pages, no sgemm): a decode
  /// row (one row at the history's last position, no window) by
  /// cpu/decode_attention.h (AVX-512's bf16 q.k takes the query in two bf16
  /// terms), two or more rows (prefill; windows too) by
  /// cpu/prefill_attention.h where it takes the head dim. Exact pages are
  /// read where they lie, lossless13 pages unpacked to bf16 first (so the
  /// lossless13 route keeps the exact route's bits). The CPU model sets it;
  /// off, every row takes attend_tile.
  bool cpu_attention_kernels = false;
};

/// Attention of `q` over layer `layer` of `history` along `view`'s route;
/// with opt.window (a sliding-window layer) only the pages inside the rows'
/// windows are planned, read and reported.
/// Throws InvalidArgument on shape mismatch (see attention::attend_tile), or
/// for a window with an injected int8s_tile kernel (it has none).
attention::Partial attend_routed(const attention::LayerHistory& history, int layer, const RoutedView& view,
                                 const attention::QueryRows& q, const attention::AttentionOptions& opt,
                                 attention::Workspace& ws);


}  // namespace activekv::route
