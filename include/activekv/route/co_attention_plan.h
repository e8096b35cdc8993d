// How many of a layer's pages the host CPU should attend while the GPU
// streams the rest (co-attention, issue 12 parts 4-5). Pure host arithmetic,
// tested without a GPU.
//
// Model. Per layer and decode step the two paths run side by side and the
// layer's merge waits for both, so a layer costs
//     max(GPU path, CPU)
//     CPU      = CPU latency + task cost + sum over kinds of CPU bytes / CPU rate
//                (task cost: the formats' fixed costs mixed by their CPU bytes)
//     GPU path = max(link, sum over kinds of resident bytes / resident rate)
//     link     = link bytes / busy link rate, if the link is done within the CPU's time; else
//                CPU + (link bytes - CPU x busy link rate) / link rate alone
// and a step costs the sum over layers. The link shares host memory with
// the CPU only while the CPU reads: after that it runs at its rate alone. Resident pages (a device copy:
// partial residency, route/residency.h) cost HBM time and no link bytes; the
// engine attends them first while the copy stream brings the streamed
// tiles, so the two overlap (max, not sum). The rates are the ones measured with
// both paths busy at once (cuda/co_attention_rates.h): host memory is shared,
// so the DMA slows while the CPU reads and the CPU slows while the DMA reads.
// The CPU takes the oldest pages first (their position does not matter to
// the cost; oldest-first keeps the recent, GPU-written pages on the GPU);
// pages it cannot read (lossless13) and resident pages stay on the GPU.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace activekv::route {

/// GB/s (1e9 bytes per second) of each path with the other one busy.
struct CoAttentionRates {
  double link_gbps = 0;       ///< pinned host -> device copies of the streamed pages while the CPU reads
  double cpu_bf16_gbps = 0;   ///< CPU attention over bf16 pages (bytes of K and V read)
  double cpu_int8s_gbps = 0;  ///< CPU attention over int8s pages (codes and token scales)
  int cpu_threads = 0;        ///< the thread count they were measured with
  /// Fixed cost of a layer's CPU share outside its attention, paid when it
  /// has any page: the round trip between layers -- the partials up, the
  /// GPU's merge, the next q down, the host function starting (ms).
  double cpu_layer_latency_ms = 0;
  /// GPU attention over resident pages, bytes of history read per second
  /// (HBM), bf16 (lossless13 too: unpacked to bf16) and int8s; 0 = not
  /// measured: resident pages are priced at nothing, as before they were.
  double resident_bf16_gbps = 0;
  double resident_int8s_gbps = 0;
  /// A layer task's cost beyond its bytes, inside its attention (its threads
  /// starting, the wait for the last item), over bf16 and int8s pages (ms);
  /// a task over both formats costs their mix by bytes. The same costs the
  /// feedback subtracts before it weighs the CPU's speed (cpu_rate_feedback.h).
  double cpu_bf16_task_ms = 0;
  double cpu_int8s_task_ms = 0;
  /// Throws InvalidArgument naming a rate that is not positive and finite
  /// (a resident rate or a cost: negative or not finite).
  void validate() const;
  /// The fixed cost of a task over b16 bytes of bf16 and b8 of int8s pages.
  double cpu_task_ms(double b16, double b8) const;
};

/// One page of a layer, oldest first, as the planner sees it.
struct PlanPage {
  uint64_t bytes = 0;        ///< bytes either path reads (the page's K/V, or its blob)
  enum Kind : uint8_t { bf16, int8s, other } kind = bf16;  ///< other: the CPU cannot attend it
  bool resident = false;     ///< has a device copy: HBM time on the GPU path, no link bytes, never the CPU's
};

struct CoAttentionPlan {
  size_t cpu_pages = 0;        ///< the first cpu_pages CPU-readable pages go to the CPU
  double share = 0;            ///< cpu_pages / pages of the layer
  double link_ms = 0;          ///< predicted per step (all layers)
  double cpu_ms = 0;           ///< predicted per step (all layers)
  double resident_ms = 0;      ///< predicted per step (all layers): the GPU over the resident pages
  double predicted_ms = 0;     ///< max(link, cpu) per layer, summed over layers
  double link_only_ms = 0;     ///< the same step with no CPU share, at the rate the link reaches alone
                               ///< (and the resident pages' time, when that is longer)
  double cpu_bf16_bytes = 0;   ///< per layer: the bytes of the CPU's bf16 pages
  double cpu_int8s_bytes = 0;  ///< per layer: the bytes of the CPU's int8s pages
  std::string describe() const;  ///< "CPU 31 of 64 pages (48 %): link 40.1 ms, CPU 39.8 ms -> 40.1 ms"
};

/// The CPU page count that minimises the predicted step for `n_layers`
/// layers shaped like `layer` (ties: fewer CPU pages). `link_alone_gbps`
/// (the link with the CPU idle) prices link_only_ms and the part of each
/// layer's link time after its CPU share is done. Throws InvalidArgument
/// for bad rates.
CoAttentionPlan plan_co_attention(std::span<const PlanPage> layer, int n_layers, const CoAttentionRates& rates,
                                  double link_alone_gbps);

/// The prediction for a given CPU page count (the first `cpu_pages` pages
/// the CPU can read, as many as there are): what a fixed share costs.
CoAttentionPlan predict_co_attention(std::span<const PlanPage> layer, int n_layers, const CoAttentionRates& rates,
                                     double link_alone_gbps, size_t cpu_pages);

}  // namespace activekv::route
