// The co-attention planner's CPU rates corrected from measured steps
// (activekv/route/cpu_rate_feedback.h): the measured speed against the
// calibration for the plan's mix of formats, its average, its guards, and a
// plan that moves to the measured balance.
#include "activekv/route/cpu_rate_feedback.h"

#include <gtest/gtest.h>

#include <vector>

#include "activekv/core/error.h"

namespace activekv::route {
namespace {

constexpr uint64_t kPage = 4 << 20;  // a 27B-shape bf16 page

// A plan whose CPU reads b16 bytes of bf16 and b8 of int8s per layer.
CoAttentionPlan plan_of(double b16, double b8) {
  CoAttentionPlan p;
  p.cpu_bf16_bytes = b16;
  p.cpu_int8s_bytes = b8;
  return p;
}

// ms for `bytes` at `gbps`.
double ms(double bytes, double gbps) { return bytes / (gbps * 1e6); }

// `r` with the task costs a calibration fitted.
CoAttentionRates with_tasks(CoAttentionRates r, double bf16_ms, double int8s_ms) {
  r.cpu_bf16_task_ms = bf16_ms;
  r.cpu_int8s_task_ms = int8s_ms;
  return r;
}

TEST(CpuRateFeedback, AFasterCpuThanCalibratedScalesBothRates) {
  const CoAttentionRates cal{45, 60, 40, 15, 0.3};
  CpuRateFeedback f(with_tasks(cal, 0.1, 0.2));
  EXPECT_DOUBLE_EQ(f.scale(), 1.0);
  EXPECT_TRUE(f.describe().empty());
  // 16 bf16 tasks of 64 MiB that ran at 90 GB/s, each with its 0.1 ms fixed cost.
  const double bytes = 16.0 * 64 * (1 << 20);
  f.observe(ms(bytes, 90) + 16 * 0.1, bytes, 16, plan_of(64 << 20, 0));
  EXPECT_NEAR(f.scale(), 1.5, 1e-12);
  EXPECT_NEAR(f.rates().cpu_bf16_gbps, 90, 1e-9);
  EXPECT_NEAR(f.rates().cpu_int8s_gbps, 60, 1e-9);  // the same factor
  EXPECT_DOUBLE_EQ(f.rates().link_gbps, 45);         // the rest as calibrated
  EXPECT_DOUBLE_EQ(f.rates().cpu_layer_latency_ms, 0.3);
  EXPECT_NE(f.describe().find("x1.50"), std::string::npos) << f.describe();
  // The next interval at 60 GB/s: the average moves half way.
  f.observe(ms(bytes, 60) + 16 * 0.1, bytes, 16, plan_of(64 << 20, 0));
  EXPECT_NEAR(f.scale(), 1.25, 1e-12);
  EXPECT_EQ(f.observations(), 2u);
}

TEST(CpuRateFeedback, AMixOfFormatsIsPricedAtEachFormatsRate) {
  const CoAttentionRates cal{45, 60, 40, 15, 0.3};
  CpuRateFeedback f(cal);
  // Half the bytes bf16, half int8s: at the calibrated rates a byte costs
  // (0.5 / 60 + 0.5 / 40) / 1e6 ms; measured exactly that -> scale 1.
  const double bytes = 1e9;
  f.observe(0.5 * ms(bytes, 60) + 0.5 * ms(bytes, 40), bytes, 8, plan_of(1e6, 1e6));
  EXPECT_NEAR(f.scale(), 1.0, 1e-12);
}

TEST(CpuRateFeedback, IgnoresWhatCannotBeWeighedAndClampsWildSamples) {
  const CoAttentionRates cal{45, 60, 40, 15, 0.3};
  CpuRateFeedback f(with_tasks(cal, 0.5, 0.5));
  const double bytes = 1e9;
  f.observe(ms(bytes, 60), bytes, CpuRateFeedback::kMinTasks - 1, plan_of(1e6, 0));  // too few tasks
  f.observe(ms(bytes, 60), bytes, 8, plan_of(0, 0));                                  // no CPU pages planned
  f.observe(8 * 0.5, bytes, 8, plan_of(1e6, 0));                                      // busy only the fixed costs
  f.observe(ms(bytes, 60), 0, 8, plan_of(1e6, 0));                                    // no bytes
  EXPECT_EQ(f.observations(), 0u);
  EXPECT_DOUBLE_EQ(f.scale(), 1.0);
  f.observe(8 * 0.5 + ms(bytes, 6000), bytes, 8, plan_of(1e6, 0));  // 100x the calibration: clamped
  EXPECT_DOUBLE_EQ(f.scale(), 4.0);
  EXPECT_THROW(CpuRateFeedback(CoAttentionRates{45, 0, 40, 15}), InvalidArgument);
  EXPECT_THROW(CpuRateFeedback(with_tasks(cal, -1, 0)), InvalidArgument);
}

TEST(CpuRateFeedback, ThePlanMovesToTheMeasuredBalance) {
  // Calibrated CPU 67 GB/s against a link of 48 busy, 55 alone (the H100
  // host's sweep, 160e8d3), where the steps' CPU read at 100.
  const std::vector<PlanPage> layer(129, PlanPage{kPage, PlanPage::bf16, false});
  const CoAttentionRates cal = with_tasks({47.8, 67.2, 60.5, 15, 0.12}, 0.14, 0.2);
  const CoAttentionPlan first = plan_co_attention(layer, 16, cal, 54.8);
  CpuRateFeedback f(cal);
  const double bytes = 16 * first.cpu_bf16_bytes;
  EXPECT_DOUBLE_EQ(first.cpu_bf16_bytes, double(first.cpu_pages) * kPage);
  f.observe(ms(bytes, 100) + 16 * 0.14, bytes, 16, first);
  const CoAttentionPlan next = plan_co_attention(layer, 16, f.rates(), 54.8);
  EXPECT_NEAR(f.scale(), 100 / 67.2, 1e-9);
  EXPECT_GT(next.cpu_pages, first.cpu_pages + 10) << first.describe() << " / " << next.describe();
  EXPECT_LT(next.predicted_ms, first.predicted_ms);
}

}  // namespace
}  // namespace activekv::route
