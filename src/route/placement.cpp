#include "activekv/route/placement.h"

#include <fmt/format.h>

#include <algorithm>

#include "activekv/core/error.h"

namespace activekv::route {
namespace {
double gib(size_t b) { return double(b) / double(1ull << 30); }
}  // namespace

std::string placement_name(KvPlacement p) {
  switch (p) {
    case KvPlacement::host: return "host";
    case KvPlacement::gpu: return "gpu";
    case KvPlacement::partial: return "partial";
    case KvPlacement::automatic: return "auto";
  }
  return "?";
}

KvPlacement parse_placement(const std::string& name) {
  for (KvPlacement p : {KvPlacement::host, KvPlacement::gpu, KvPlacement::partial, KvPlacement::automatic})
    if (placement_name(p) == name) return p;
  throw InvalidArgument(fmt::format("unknown KV placement '{}' (expected host, gpu, partial or auto)", name));
}

size_t gpu_margin_bytes(size_t total_bytes) { return std::max<size_t>(size_t(1) << 30, total_bytes / 20); }

size_t default_gpu_kv_budget(size_t free_bytes, size_t total_bytes) {
  const size_t margin = gpu_margin_bytes(total_bytes);
  return free_bytes > margin ? free_bytes - margin : 0;
}

PlacementChoice choose_placement(KvPlacement requested, size_t history_bytes, size_t budget_bytes,
                                 size_t tail_bytes) {
  PlacementChoice c;
  c.history_bytes = history_bytes;
  c.budget_bytes = budget_bytes;
  const bool fits = history_bytes <= budget_bytes;
  const bool room_past_tails = budget_bytes > tail_bytes;
  switch (requested) {
    case KvPlacement::host:
      c.placement = KvPlacement::host;
      c.reason = "host (asked): every page streams from pinned host memory each step";
      break;
    case KvPlacement::gpu:
      if (!fits)
        throw Error(fmt::format("--kv-placement gpu: the history needs {:.2f} GiB on the GPU, the budget is {:.2f} GiB "
                                "(use --kv-placement host or auto, a smaller -c, or a larger --gpu-kv-mem)",
                                gib(history_bytes), gib(budget_bytes)));
      c.placement = KvPlacement::gpu;
      c.reason = fmt::format("gpu (asked): the history ({:.2f} GiB) is resident on the GPU", gib(history_bytes));
      break;
    case KvPlacement::partial:
      if (!room_past_tails)
        throw Error(fmt::format("--kv-placement partial: the GPU budget ({:.2f} GiB) holds no more than the tail pages "
                                "({:.2f} GiB): nothing else could stay resident (use --kv-placement host or a larger "
                                "--gpu-kv-mem)",
                                gib(budget_bytes), gib(tail_bytes)));
      c.placement = KvPlacement::partial;
      c.reason = fmt::format("partial (asked): the hot pages stay resident within the GPU budget ({:.2f} GiB of a "
                             "{:.2f} GiB history), the rest streams",
                             gib(budget_bytes), gib(history_bytes));
      break;
    case KvPlacement::automatic:
      if (fits) {
        c.placement = KvPlacement::gpu;
        c.reason = fmt::format("gpu (auto): the history ({:.2f} GiB) fits the GPU budget ({:.2f} GiB)",
                               gib(history_bytes), gib(budget_bytes));
      } else if (room_past_tails) {
        c.placement = KvPlacement::partial;
        c.reason = fmt::format("partial (auto): the history ({:.2f} GiB) exceeds the GPU budget ({:.2f} GiB): the hot "
                               "pages stay resident, the rest streams",
                               gib(history_bytes), gib(budget_bytes));
      } else {
        c.placement = KvPlacement::host;
        c.reason = fmt::format("host (auto): the GPU budget ({:.2f} GiB) holds no more than the tail pages "
                               "({:.2f} GiB) of a {:.2f} GiB history",
                               gib(budget_bytes), gib(tail_bytes), gib(history_bytes));
      }
      break;
  }
  return c;
}

}  // namespace activekv::route
