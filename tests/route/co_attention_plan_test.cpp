// The co-attention planner (activekv/route/co_attention_plan.h): the CPU page
// count that balances the link and the CPU, its predicted step, and the pages
// it must leave alone.
#include "activekv/route/co_attention_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "activekv/core/error.h"

namespace activekv::route {
namespace {

constexpr uint64_t kPage = 4 << 20;  // a 27B-shape bf16 page: 4 KV heads x 1024 tokens x 256 x K,V x 2 bytes

std::vector<PlanPage> pages(size_t n, PlanPage::Kind kind = PlanPage::bf16, uint64_t bytes = kPage) {
  return std::vector<PlanPage>(n, PlanPage{bytes, kind, false});
}

TEST(CoAttentionPlan, EqualRatesSplitTheLayerInHalf) {
  const CoAttentionRates r{50, 50, 40, 15};
  const CoAttentionPlan p = plan_co_attention(pages(64), 16, r, 55);
  EXPECT_EQ(p.cpu_pages, 32u);
  EXPECT_DOUBLE_EQ(p.share, 0.5);
  // 32 pages x 4 MiB x 16 layers at 50 GB/s on each path.
  EXPECT_NEAR(p.predicted_ms, 16 * 32 * double(kPage) / 50e6, 1e-9);
  EXPECT_NEAR(p.link_only_ms, 16 * 64 * double(kPage) / 55e6, 1e-9);
  EXPECT_NE(p.describe().find("32 pages"), std::string::npos) << p.describe();
}

TEST(CoAttentionPlan, ASlowerCpuTakesFewerPagesAndTheStepIsTheSlowerPath) {
  const CoAttentionRates r{50, 25, 20, 15};
  const CoAttentionPlan p = plan_co_attention(pages(60), 1, r, 55);
  EXPECT_EQ(p.cpu_pages, 20u);  // 40 pages / 50 = 20 pages / 25: balanced
  EXPECT_NEAR(p.predicted_ms, std::max(p.link_ms, p.cpu_ms), 1e-12);
  EXPECT_LT(p.predicted_ms, p.link_only_ms);
}

TEST(CoAttentionPlan, Int8sPagesArePricedAtTheirOwnRate) {
  // Half the bytes per page, read by the CPU at 20 GB/s against the link's 50.
  std::vector<PlanPage> layer = pages(70, PlanPage::int8s, kPage / 2);
  const CoAttentionRates r{50, 60, 20, 15};
  const CoAttentionPlan p = plan_co_attention(layer, 1, r, 55);
  EXPECT_EQ(p.cpu_pages, 20u);  // 50 pages / 50 = 20 pages / 20
  EXPECT_DOUBLE_EQ(p.cpu_int8s_bytes, 20.0 * (kPage / 2));  // what the CPU reads, per format
  EXPECT_DOUBLE_EQ(p.cpu_bf16_bytes, 0.0);
}

TEST(CoAttentionPlan, LeavesPagesTheCpuCannotReadAndResidentPagesAlone) {
  std::vector<PlanPage> layer = pages(10, PlanPage::other);  // lossless13
  layer.push_back(PlanPage{kPage, PlanPage::bf16, true});    // the tail, on the GPU
  const CoAttentionRates r{50, 50, 50, 4};
  CoAttentionPlan p = plan_co_attention(layer, 4, r, 55);
  EXPECT_EQ(p.cpu_pages, 0u);
  EXPECT_DOUBLE_EQ(p.predicted_ms, p.link_only_ms);
  // A fast CPU never takes more than balance: with nothing to stream, no page
  // moves (a tie keeps the CPU idle).
  p = plan_co_attention(pages(0), 4, r, 55);
  EXPECT_EQ(p.cpu_pages, 0u);
  EXPECT_DOUBLE_EQ(p.predicted_ms, 0.0);
}

TEST(CoAttentionPlan, AFixedCountIsPricedTheSameWay) {
  const CoAttentionRates r{50, 25, 20, 15};
  const std::vector<PlanPage> layer = pages(60);
  const CoAttentionPlan best = plan_co_attention(layer, 2, r, 55);
  EXPECT_DOUBLE_EQ(predict_co_attention(layer, 2, r, 55, best.cpu_pages).predicted_ms, best.predicted_ms);
  const CoAttentionPlan ten = predict_co_attention(layer, 2, r, 55, 10);
  EXPECT_EQ(ten.cpu_pages, 10u);
  // The link's 50 pages dominate: 20 of them at 50 GB/s while the CPU reads
  // its 10 (0.4 page-times), the other 30 at the rate alone, 55.
  const double page_ms = double(kPage) / 1e6;
  EXPECT_NEAR(ten.predicted_ms, 2 * page_ms * (10.0 / 25 + 30.0 / 55), 1e-9);
  EXPECT_EQ(predict_co_attention(layer, 2, r, 55, 1000).cpu_pages, 60u);  // no more than there are
  EXPECT_EQ(predict_co_attention(layer, 2, r, 55, 0).predicted_ms, best.link_only_ms);
}

TEST(CoAttentionPlan, TheLinkRunsAtItsRateAloneOnceTheCpuIsDone) {
  const CoAttentionRates r{40, 20, 20, 15};
  const std::vector<PlanPage> layer = pages(100);
  const double page_ms = double(kPage) / 1e6;
  // 10 CPU pages: the CPU reads for 0.5 page-times; the link moves 20 pages
  // at 40 GB/s meanwhile and the other 70 at 50 alone.
  EXPECT_NEAR(predict_co_attention(layer, 1, r, 50, 10).predicted_ms, page_ms * (0.5 + 70.0 / 50), 1e-9);
  // 30 CPU pages (1.5 page-times) against 70 streamed: 60 while the CPU
  // reads, 10 alone.
  EXPECT_NEAR(predict_co_attention(layer, 1, r, 50, 30).link_ms, page_ms * (1.5 + 10.0 / 50), 1e-9);
  // 40 CPU pages (2 page-times): the link's 60 pages take 1.5 at the busy
  // rate, inside the CPU's time; the CPU is the step.
  const CoAttentionPlan p = predict_co_attention(layer, 1, r, 50, 40);
  EXPECT_NEAR(p.link_ms, page_ms * 1.5, 1e-9);
  EXPECT_NEAR(p.predicted_ms, page_ms * 2.0, 1e-9);
  // The best count balances the two: 32 pages (1.6) against 68 streamed
  // (64 busy + 4 alone = 1.68); 33 (1.65) against 67 (66 + 1 = 1.67); 34
  // pages take the CPU 1.7.
  EXPECT_EQ(plan_co_attention(layer, 1, r, 50).cpu_pages, 33u);
}

TEST(CoAttentionPlan, TheCpuLatencyIsPaidOncePerLayerAndCanMakeSharingNotPay) {
  CoAttentionRates r{50, 50, 40, 15};
  r.cpu_layer_latency_ms = 0.5;
  // 4 pages of 4 MiB: the link alone takes 0.34 ms per layer, less than the CPU's latency.
  EXPECT_EQ(plan_co_attention(pages(4), 16, r, 50).cpu_pages, 0u);
  // 64 pages: sharing pays; the CPU side carries the latency once per layer.
  const CoAttentionPlan p = plan_co_attention(pages(64), 16, r, 50);
  EXPECT_GT(p.cpu_pages, 20u);
  EXPECT_LT(p.cpu_pages, 32u);
  EXPECT_NEAR(p.cpu_ms, 16 * (0.5 + double(p.cpu_pages) * double(kPage) / 50e6), 1e-9);
}

// A task's fixed cost by format, mixed by the CPU's bytes (the feedback
// subtracts the same before it weighs the CPU's speed: cpu_rate_feedback.h).
TEST(CoAttentionPlan, EachFormatsTaskCostIsMixedByItsCpuBytes) {
  CoAttentionRates r{50, 50, 40, 15};
  r.cpu_layer_latency_ms = 0.1;
  r.cpu_bf16_task_ms = 0.3;
  r.cpu_int8s_task_ms = 0.1;
  std::vector<PlanPage> layer = pages(8);  // bf16 pages, then int8s pages of half the bytes
  for (const PlanPage& p : pages(8, PlanPage::int8s, kPage / 2)) layer.push_back(p);
  const double page_ms = double(kPage) / 1e6;
  // Only bf16 pages: the bf16 task cost.
  EXPECT_NEAR(predict_co_attention(layer, 1, r, 50, 4).cpu_ms, 0.1 + 0.3 + 4 * page_ms / 50, 1e-12);
  // 8 bf16 pages (8 units of bytes) and 8 int8s (4 units): (8 x 0.3 + 4 x 0.1) / 12.
  EXPECT_NEAR(predict_co_attention(layer, 1, r, 50, 16).cpu_ms,
              0.1 + (8 * 0.3 + 4 * 0.1) / 12 + 8 * page_ms / 50 + 8 * 0.5 * page_ms / 40, 1e-12);
  r.cpu_int8s_task_ms = -1;
  EXPECT_THROW(plan_co_attention(layer, 1, r, 50), InvalidArgument);
}

TEST(CoAttentionPlan, BadRatesNameTheirPath) {
  for (const CoAttentionRates r : {CoAttentionRates{0, 1, 1, 1}, CoAttentionRates{1, -1, 1, 1},
                                   CoAttentionRates{1, 1, std::nan(""), 1}}) {
    EXPECT_THROW(plan_co_attention(pages(4), 1, r, 55), InvalidArgument);
  }
  EXPECT_THROW(plan_co_attention(pages(4), 0, CoAttentionRates{1, 1, 1, 1}, 55), InvalidArgument);
  EXPECT_THROW(plan_co_attention(pages(4), 1, CoAttentionRates{1, 1, 1, 1}, 0), InvalidArgument);
}

}  // namespace
}  // namespace activekv::route
