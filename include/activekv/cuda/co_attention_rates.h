// Measures, on this machine, the rates the co-attention planner prices
// (activekv/route/co_attention_plan.h): pinned host -> device copies, and the
// CPU decode-attention kernels (activekv/cpu/decode_attention.h) over bf16 and
// int8s pages of the model's shape -- each alone, and with the other path busy
// at the same time (host memory is shared: each slows the other).
//
// Method: 64 MiB cudaMemcpyAsync copies from 512 MiB of pinned memory in
// turn, back to back on one stream, for `seconds`; the CPU kernel over >= 256 MiB of random bf16
// history (far past any last-level cache: a cached working set reads faster
// than a real history and hides the two paths' contention), then the same
// pages encoded to int8s, call after call on `cpu_threads` threads for
// `seconds`. "Together": the copies run on a second host thread while the CPU
// kernel runs. Bytes of history per second (cpu::history_bytes), 1e9 bytes
// per GB. The CPU layer latency: the round trip a step pays between one
// layer's CPU attention and the next's (partials up, the GPU's wait and merge,
// the next q down, the host function and its threads starting), measured as
// the idle time between layers of the decode engine itself over 8 layers of
// one CPU page and one streamed page, 20 steps. The GPU over resident pages (the planner's price of a page with a
// device copy): the decode engine over device copies of the same bf16 pages,
// then of their int8s encoding, one layer, step after step for `seconds`
// each. About 7 x `seconds` plus the encoding (a fraction of a second).
#pragma once

#include <vector>

#include "activekv/cuda/decode_attention.h"
#include "activekv/cuda/decode_engine.h"
#include "activekv/route/co_attention_plan.h"

namespace activekv::cuda {

struct CoAttentionCalibration {
  route::CoAttentionRates together;  ///< each path with the other busy: what the planner uses
  double link_alone_gbps = 0;
  double cpu_bf16_alone_gbps = 0;
  double cpu_int8s_alone_gbps = 0;
  size_t history_bytes = 0;  ///< of the bf16 pages the CPU read (the int8s pages are their encoding)
  /// "link 55.1 GB/s alone, 49.0 with the CPU busy; CPU bf16 60.2 / 48.9, int8s 41.0 / 33.2 (15 threads)"
  std::string describe() const;
};

/// The planner's view of one layer's page table: bf16 and int8s pages the
/// CPU can read, lossless13 ones it cannot, pages with a device copy resident.
std::vector<route::PlanPage> plan_pages(const std::vector<PageRef>& table);

/// Runs the measurement on the current device. Throws CudaError when the
/// memory cannot be had, InvalidArgument for a bad shape or thread count.
CoAttentionCalibration measure_co_attention_rates(const AttnShape& shape, int cpu_threads, double seconds = 0.2);

}  // namespace activekv::cuda
