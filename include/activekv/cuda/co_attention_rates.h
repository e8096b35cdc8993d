// Measures, on this machine, the rates the co-attention planner prices
// (activekv/route/co_attention_plan.h): pinned host -> device copies, and the
// CPU decode-attention kernels (activekv/cpu/decode_attention.h) over bf16 and
// int8s pages of the model's shape -- each alone, and with the other path busy
// at the same time (host memory is shared: each slows the other).
//
// Method. The link alone: 64 MiB cudaMemcpyAsync copies from 512 MiB of
// pinned memory in turn, back to back on one stream, for `seconds`. The CPU
// kernel alone (reported, not priced): one call after another over 256 MiB
// of random bf16 history (ACTIVEKV_COATT_HISTORY_MIB, 64..16384, sets
// another size: a cached working set reads faster than a real history; on
// an H100 host with 105 MiB of L3, 256 MiB predicted as well as 2 GiB:
// h100_coatt_history_ab_160e8d3.json), then over the same pages encoded to int8s. The planner's rates
// come from the decode engine itself running co-attention steps (20 after 3
// warm-up ones, steps apart): 4 layers, each with n CPU pages (distinct in
// every layer) and 2n streamed bf16 pages, so that the link outlasts the CPU and the CPU always reads with
// the link busy; n a quarter and all of the history over the 4 layers, for
// bf16 and for int8s CPU pages. Per format, the CPU's busy time per layer
// (DecodeEngine::CpuTiming) against its bytes gives a line: its slope is the
// rate, its intercept a layer task's fixed cost. Measured on the H200 host at
// a5be516, the engine read bf16 at 50-79 GB/s where one call read 99-104, and
// the kernel alone had priced the plans 0.2-29 % low. The CPU layer latency is
// the idle time between layers (partials up, the GPU's wait and merge, the
// next q down, the host function starting); each format's intercept is its
// task cost (the planner mixes them by bytes, as the feedback does). The link's rate with the CPU busy is solved from the
// large bf16 probe's step time with the planner's two-phase model (the link
// at that rate while the CPU reads, alone after). The GPU over resident pages
// (the planner's price of a page with a device copy): the decode engine over
// device copies of the same bf16 pages, then of their int8s encoding, one
// layer, step after step for `seconds` each. About 4 x `seconds` plus the
// probes: 4 x 23 steps of 4 layers (estimated ~1 s for the 27B shape; not yet timed).
#pragma once

#include <string>
#include <vector>

#include "activekv/cuda/decode_attention.h"
#include "activekv/cuda/decode_engine.h"
#include "activekv/route/co_attention_plan.h"

namespace activekv::cuda {

/// One engine probe of the calibration, as measured (per layer of the probe):
/// kept so that a plan's error can be traced to the probes, not only to the
/// rates fitted through them.
struct CoAttentionProbe {
  std::string name;           ///< "bf16 small", "bf16 large", "int8s small", "int8s large", "bf16 cpu-bound"
  double cpu_bytes = 0;       ///< history bytes the CPU attended, per layer
  double streamed_bytes = 0;  ///< bytes streamed over the link, per layer
  double busy_ms = 0;         ///< the CPU inside its attention, per layer
  double idle_ms = 0;         ///< between two layers' CPU tasks, per transition
  double step_ms = 0;         ///< a step's wall time, per layer
};

struct CoAttentionCalibration {
  route::CoAttentionRates together;  ///< each path with the other busy, from the engine: what the planner uses
  double link_alone_gbps = 0;
  double cpu_bf16_alone_gbps = 0;   ///< the CPU kernel alone, one call over the whole history (not priced)
  double cpu_int8s_alone_gbps = 0;  ///< the same over the int8s encoding (not priced)
  size_t history_bytes = 0;  ///< of the bf16 pages the CPU read (the int8s pages are their encoding)
  std::vector<CoAttentionProbe> probes;  ///< the engine probes the rates were fitted through
  /// "link 55.2 GB/s alone, 51.0 with the CPU busy; CPU bf16 99.2 / 85.6, int8s 56.8 / 55.6 GB/s (...)"
  std::string describe() const;
};

/// The planner's view of one layer's page table: bf16 and int8s pages the
/// CPU can read, lossless13 ones it cannot, pages with a device copy resident.
std::vector<route::PlanPage> plan_pages(const std::vector<PageRef>& table);

/// Runs the measurement on the current device. Throws CudaError when the
/// memory cannot be had, InvalidArgument for a bad shape or thread count or
/// an ACTIVEKV_COATT_HISTORY_MIB that is not a whole number in 64..16384.
CoAttentionCalibration measure_co_attention_rates(const AttnShape& shape, int cpu_threads, double seconds = 0.2);

/// measure_co_attention_rates once per process for each (current device,
/// shape, thread count, seconds): the rates are the machine's, and every
/// sequence of a batch or server asks (each measurement pins 768 MiB: 256
/// of history by default, 512 of copy sources; its time, estimated ~1 s, is not yet
/// measured; and one run beside another sequence's decoding would
/// measure contended rates). Thread-safe: a second caller waits for the
/// first's measurement. A failed measurement is not kept (the next call tries
/// again). Throws as measure_co_attention_rates.
CoAttentionCalibration co_attention_rates_once(const AttnShape& shape, int cpu_threads, double seconds = 0.2);

}  // namespace activekv::cuda
