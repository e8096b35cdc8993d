// Where the KV history lives during decode (issue "One runtime", SPEC §8):
//
//   host  every page stays in pinned host memory and streams to the GPU each
//         step (the project's reason to exist: a history larger than HBM);
//   gpu   every page is also copied to GPU memory and read there (HBM time,
//         no transfer) -- what a user with room on the GPU wants;
//   auto  gpu when the whole history (context length, all layers, the
//         formats the route reads) fits the GPU budget, host otherwise.
//
// The budget defaults to the device memory free once the weights and the
// runtime's buffers are allocated, less a margin. Pure host logic: tested
// without a GPU.
#pragma once

#include <cstddef>
#include <string>

namespace activekv::route {

enum class KvPlacement { host, gpu, automatic };

/// "host" / "gpu" / "auto".
std::string placement_name(KvPlacement p);
/// Parses "host", "gpu" or "auto"; throws InvalidArgument naming the accepted values.
KvPlacement parse_placement(const std::string& name);

/// The margin kept free on the GPU: max(1 GiB, 5 % of total).
size_t gpu_margin_bytes(size_t total_bytes);
/// Default history budget: free - margin (0 if that is negative).
size_t default_gpu_kv_budget(size_t free_bytes, size_t total_bytes);

struct PlacementChoice {
  KvPlacement placement = KvPlacement::host;  ///< host or gpu, never automatic
  size_t history_bytes = 0;  ///< device bytes the history needs resident
  size_t budget_bytes = 0;
  std::string reason;        ///< one line for the summary
};

/// Decides host or gpu. `requested` gpu with a history over the budget
/// throws Error naming both sizes; auto picks gpu iff history <= budget.
PlacementChoice choose_placement(KvPlacement requested, size_t history_bytes, size_t budget_bytes);

}  // namespace activekv::route
