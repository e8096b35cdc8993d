// Corrects the co-attention planner's CPU rates from the steps themselves
// (issue 12 part 4). The calibration (cuda/co_attention_rates.h) measures the
// CPU for about a second when a runtime starts; across five fresh processes
// on one H100 host it priced the CPU's bf16 reads with the link busy at 67 to
// 104 GB/s, and at 67 the planner gave the CPU 57 % of a 128K layer where 70 %
// was 20 % faster (docs/co-attention.md). The engine times every CPU layer
// task (cuda::DecodeEngine::CpuTiming: busy time, bytes): against what the
// calibrated rates give those bytes, that is the CPU's true speed. observe()
// takes such an interval; rates() is the calibration with both CPU rates
// scaled by the measured speed (an exponential average over intervals). Pure
// host arithmetic, tested without a GPU.
#pragma once

#include <cstddef>
#include <string>

#include "activekv/route/co_attention_plan.h"

namespace activekv::route {

class CpuRateFeedback {
 public:
  /// calibrated: the rates measured at start, with the task costs the
  /// planner prices (cpu_bf16_task_ms, cpu_int8s_task_ms: subtracted from a
  /// measured busy time before its bytes are weighed). InvalidArgument as
  /// CoAttentionRates::validate.
  explicit CpuRateFeedback(const CoAttentionRates& calibrated);

  /// One measured interval of CPU layer tasks: their busy time summed (ms),
  /// the history bytes they read, how many ran, and the plan they ran (its
  /// cpu_bf16_bytes / cpu_int8s_bytes give the mix of formats). Intervals of
  /// fewer than kMinTasks tasks, without CPU pages in the plan, or whose busy
  /// time is not beyond the fixed costs are ignored. A sample is clamped to
  /// [1/4, 4] times the calibration before it enters the average.
  void observe(double busy_ms, double bytes, size_t tasks, const CoAttentionPlan& plan);

  /// The calibration with cpu_bf16_gbps and cpu_int8s_gbps times scale().
  CoAttentionRates rates() const;
  /// Measured CPU speed over the calibrated one (1 until the first interval).
  double scale() const { return scale_; }
  size_t observations() const { return n_; }
  /// "CPU rates x1.31 from 12 intervals of the steps" (empty before the first).
  std::string describe() const;

  static constexpr size_t kMinTasks = 4;
  static constexpr double kWeight = 0.5;  ///< of a new sample in the average: a few steps to converge

 private:
  CoAttentionRates calibrated_;
  double scale_ = 1.0;
  size_t n_ = 0;
};

}  // namespace activekv::route
