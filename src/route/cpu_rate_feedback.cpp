// The co-attention planner's CPU rates corrected from measured steps: see
// include/activekv/route/cpu_rate_feedback.h.
#include "activekv/route/cpu_rate_feedback.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "activekv/core/error.h"

namespace activekv::route {

CpuRateFeedback::CpuRateFeedback(const CoAttentionRates& calibrated) : calibrated_(calibrated) {
  calibrated_.validate();
}

void CpuRateFeedback::observe(double busy_ms, double bytes, size_t tasks, const CoAttentionPlan& plan) {
  const double b16 = plan.cpu_bf16_bytes, b8 = plan.cpu_int8s_bytes;
  if (tasks < kMinTasks || !(bytes > 0) || !(b16 + b8 > 0) || !std::isfinite(busy_ms)) return;
  // The plan's mix prices a byte at the calibrated rates, and a task's fixed cost.
  const double share16 = b16 / (b16 + b8);
  const double ms_per_byte = (share16 / calibrated_.cpu_bf16_gbps + (1 - share16) / calibrated_.cpu_int8s_gbps) / 1e6;
  const double fixed_ms = calibrated_.cpu_task_ms(b16, b8);
  const double variable_ms = busy_ms - fixed_ms * double(tasks);
  if (!(variable_ms > 0)) return;
  const double sample = std::clamp(bytes * ms_per_byte / variable_ms, 0.25, 4.0);
  scale_ = n_ == 0 ? sample : scale_ + kWeight * (sample - scale_);
  ++n_;
}

CoAttentionRates CpuRateFeedback::rates() const {
  CoAttentionRates r = calibrated_;
  r.cpu_bf16_gbps *= scale_;
  r.cpu_int8s_gbps *= scale_;
  return r;
}

std::string CpuRateFeedback::describe() const {
  if (n_ == 0) return {};
  return fmt::format("CPU rates x{:.2f} from {} intervals of the steps (bf16 {:.1f}, int8s {:.1f} GB/s)", scale_, n_,
                     calibrated_.cpu_bf16_gbps * scale_, calibrated_.cpu_int8s_gbps * scale_);
}

}  // namespace activekv::route
