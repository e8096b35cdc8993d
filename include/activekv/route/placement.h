// Where the KV history lives during decode (issue "One runtime", SPEC §8):
//
//   host  every page stays in pinned host memory and streams to the GPU each
//         step (the project's reason to exist: a history larger than HBM);
//   gpu   every page is also copied to GPU memory and read there (HBM time,
//         no transfer) -- what a user with room on the GPU wants;
//   partial  the hot pages (each layer's tail, sink, recent window, then as
//         many others as fit, newest first) keep a device copy within the
//         budget; the rest streams, or goes to the host CPU with co-attention
//         (route/residency.h);
//   auto  gpu when the whole history (context length, all layers, the
//         formats the route reads) fits the GPU budget; else partial when the
//         budget holds more than each layer's tail page; else host.
//
// The budget defaults to the device memory free once the weights and the
// runtime's buffers are allocated, less a margin. Pure host logic: tested
// without a GPU.
#pragma once

#include <cstddef>
#include <string>

namespace activekv::route {

enum class KvPlacement { host, gpu, partial, automatic };

/// "host" / "gpu" / "partial" / "auto".
std::string placement_name(KvPlacement p);
/// Parses "host", "gpu", "partial" or "auto"; throws InvalidArgument naming the accepted values.
KvPlacement parse_placement(const std::string& name);

/// The margin kept free on the GPU: max(1 GiB, 5 % of total).
size_t gpu_margin_bytes(size_t total_bytes);
/// Default history budget: free - margin (0 if that is negative).
size_t default_gpu_kv_budget(size_t free_bytes, size_t total_bytes);

struct PlacementChoice {
  KvPlacement placement = KvPlacement::host;  ///< host, gpu or partial, never automatic
  size_t history_bytes = 0;  ///< device bytes the history needs resident
  size_t budget_bytes = 0;
  std::string reason;        ///< one line for the summary
};

/// Decides host, gpu or partial. `tail_bytes`: the device bytes every
/// layer's tail page takes (what any placement keeps on the GPU). `requested`
/// gpu with a history over the budget, or partial with a budget that holds
/// no more than the tails, throws Error naming both sizes; auto picks gpu iff
/// history <= budget, else partial iff budget > tail_bytes, else host.
PlacementChoice choose_placement(KvPlacement requested, size_t history_bytes, size_t budget_bytes,
                                 size_t tail_bytes = 0);

}  // namespace activekv::route
