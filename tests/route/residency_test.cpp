#include "activekv/route/residency.h"

#include <gtest/gtest.h>

#include <vector>

#include "activekv/core/error.h"
#include "activekv/route/co_attention_plan.h"
#include "activekv/route/placement.h"

namespace activekv::route {
namespace {

constexpr uint64_t kPage = 1000;  // a bf16 page's bytes
constexpr uint64_t kEnc = 510;    // its int8s encoding

std::vector<ResidencyPage> bf16_pages(size_t n) { return std::vector<ResidencyPage>(n, ResidencyPage{kPage, false}); }

std::vector<size_t> indexes(const std::vector<bool>& flags) {
  std::vector<size_t> out;
  for (size_t i = 0; i < flags.size(); ++i)
    if (flags[i]) out.push_back(i);
  return out;
}

TEST(Residency, TailSinkRecentThenNewestFirst) {
  // 10 pages, room for 6: the tail (9), the sink (0), recent 8 and 7, then 6 and 5.
  const auto r = choose_resident_pages(bf16_pages(10), 1, 2, {6 * kPage});
  EXPECT_EQ(indexes(r), (std::vector<size_t>{0, 5, 6, 7, 8, 9}));
  // Room for 2: the tail and the sink only.
  EXPECT_EQ(indexes(choose_resident_pages(bf16_pages(10), 1, 2, {2 * kPage})), (std::vector<size_t>{0, 9}));
  // Room for 3 with two sink pages: tail, sinks 0 and 1; no recent page fits.
  EXPECT_EQ(indexes(choose_resident_pages(bf16_pages(10), 2, 2, {3 * kPage})), (std::vector<size_t>{0, 1, 9}));
  // Everything fits: everything resident.
  EXPECT_EQ(indexes(choose_resident_pages(bf16_pages(4), 1, 2, {100 * kPage})).size(), 4u);
}

TEST(Residency, TheTailIsResidentEvenPastTheBudget) {
  EXPECT_EQ(indexes(choose_resident_pages(bf16_pages(5), 1, 2, {0})), (std::vector<size_t>{4}));
  EXPECT_EQ(indexes(choose_resident_pages(bf16_pages(1), 1, 2, {0})), (std::vector<size_t>{0}));
  EXPECT_TRUE(choose_resident_pages({}, 1, 2, {kPage}).empty());
}

TEST(Residency, AnEncodedPageCostsItsEncodedBytes) {
  // Hybrid's steady state: sink, 2 recent and the tail bf16, the middle int8s.
  std::vector<ResidencyPage> pages(12, ResidencyPage{kEnc, true});
  for (size_t p : {0, 9, 10, 11}) pages[p] = {kPage, false};
  // 4 bf16 pages (4000) + 3 encoded (1530) = 5530 <= 5600; a fourth encoded one would pass it.
  const auto r = choose_resident_pages(pages, 1, 2, {5600});
  EXPECT_EQ(indexes(r), (std::vector<size_t>{0, 6, 7, 8, 9, 10, 11}));
  // A bf16 page that does not fit is skipped, a smaller encoded one after it still taken.
  std::vector<ResidencyPage> mixed{{kEnc, true}, {kPage, false}, {kPage, false}};
  EXPECT_EQ(indexes(choose_resident_pages(mixed, 0, 0, {kPage + kEnc})), (std::vector<size_t>{0, 2}));
}

TEST(Residency, SlotsCapEachKind) {
  std::vector<ResidencyPage> pages(8, ResidencyPage{kPage, false});
  ResidencyLimits lim{100 * kPage, 2, 0};  // bytes for all, but two bf16 slots (the tail not counted)
  EXPECT_EQ(indexes(choose_resident_pages(pages, 1, 2, lim)), (std::vector<size_t>{0, 6, 7}));
  pages[3] = pages[2] = {kEnc, true};
  lim.encoded_slots = 1;
  EXPECT_EQ(indexes(choose_resident_pages(pages, 1, 2, lim)), (std::vector<size_t>{0, 3, 6, 7}));
  EXPECT_THROW(choose_resident_pages(pages, -1, 2, lim), InvalidArgument);
}

TEST(Residency, PlanSizesThePoolsForTheSteadyState) {
  RouteConfig exact;
  // 40 pages of 1000 tokens per layer, 4 layers, a budget of 48 pages: 12 per layer.
  ResidencyPlan p = plan_residency(exact, 40 * 1000, 1000, 4, kPage, 0, 48 * kPage);
  EXPECT_EQ(p.layer_pages, 40u);
  EXPECT_EQ(p.resident_pages, 12u);
  EXPECT_EQ(p.bf16_slots, 11u);
  EXPECT_EQ(p.encoded_slots, 0u);
  EXPECT_EQ(p.resident_bytes, 12 * kPage);
  EXPECT_EQ(p.history_bytes, 40 * kPage);

  RouteConfig hybrid;
  hybrid.kind = RouteKind::hybrid;  // sink 1, recent 2
  // A partly written tail: 39 full pages + 1. Per layer 8000 bytes: tail + sink + 2 recent (4000) + 7 int8s (3570).
  p = plan_residency(hybrid, 39 * 1000 + 500, 1000, 4, kPage, kEnc, 4 * 8000);
  EXPECT_EQ(p.layer_pages, 40u);
  EXPECT_EQ(p.bf16_slots, 3u);
  EXPECT_EQ(p.encoded_slots, 7u);
  EXPECT_EQ(p.resident_pages, 11u);
  EXPECT_EQ(p.resident_bytes, 4 * kPage + 7 * kEnc);
  EXPECT_EQ(p.history_bytes, 4 * kPage + 36 * kEnc);
  EXPECT_NE(p.describe().find("11 of 40 pages"), std::string::npos) << p.describe();

  EXPECT_THROW(plan_residency(hybrid, 1000, 1000, 4, kPage, 0, kPage), InvalidArgument);  // no encoded size
  EXPECT_THROW(plan_residency(exact, 0, 1000, 4, kPage, 0, kPage), InvalidArgument);
}

TEST(Residency, AutoPlacementPicksPartialBetweenTheTailsAndTheHistory) {
  constexpr size_t GiB = size_t(1) << 30;
  EXPECT_EQ(choose_placement(KvPlacement::automatic, 2 * GiB, 3 * GiB, GiB / 8).placement, KvPlacement::gpu);
  const PlacementChoice c = choose_placement(KvPlacement::automatic, 4 * GiB, 2 * GiB, GiB / 8);
  EXPECT_EQ(c.placement, KvPlacement::partial);
  EXPECT_NE(c.reason.find("partial (auto)"), std::string::npos) << c.reason;
  EXPECT_EQ(choose_placement(KvPlacement::automatic, 4 * GiB, GiB / 8, GiB / 8).placement, KvPlacement::host);
  EXPECT_EQ(choose_placement(KvPlacement::partial, 4 * GiB, GiB, GiB / 8).placement, KvPlacement::partial);
  EXPECT_THROW(choose_placement(KvPlacement::partial, 4 * GiB, GiB / 8, GiB / 8), Error);
}

// The planner with resident pages: they move no link bytes, cost HBM time,
// and the CPU never takes them.
TEST(Residency, PlannerPricesResidentPagesInHbmTime) {
  std::vector<PlanPage> layer(64, PlanPage{1'000'000, PlanPage::bf16, false});
  const CoAttentionRates no_hbm{50, 50, 40, 15};
  const CoAttentionPlan all_streamed = plan_co_attention(layer, 16, no_hbm, 55);
  for (size_t p = 32; p < 64; ++p) layer[p].resident = true;  // the newer half resident
  CoAttentionRates r = no_hbm;
  r.resident_bf16_gbps = 2000;
  const CoAttentionPlan half = plan_co_attention(layer, 16, r, 55);
  // Link only: 32 MB per layer at 55 GB/s = 0.582 ms, x16 = 9.31 ms; the resident half 32 MB at 2000 GB/s x16 = 0.256 ms.
  EXPECT_NEAR(half.link_only_ms, 16 * 32.0 / 55.0, 1e-9);
  EXPECT_NEAR(half.resident_ms, 16 * 32.0 / 2000.0, 1e-9);
  EXPECT_LT(half.link_only_ms, all_streamed.link_only_ms);
  EXPECT_LE(half.cpu_pages, 32u);  // only the streamed half can go to the CPU
  EXPECT_LT(half.predicted_ms, all_streamed.predicted_ms);
  // When the resident pages take longer than the link, they bound the step:
  // a CPU share past the point where the link drops below them gains nothing.
  r.resident_bf16_gbps = 40;  // 32 MB at 40 GB/s = 0.8 ms per layer, more than the streamed half's link time
  const CoAttentionPlan slow = plan_co_attention(layer, 16, r, 55);
  EXPECT_EQ(slow.cpu_pages, 0u);
  EXPECT_NEAR(slow.predicted_ms, 16 * 0.8, 1e-9);
  EXPECT_NE(slow.describe().find("resident"), std::string::npos) << slow.describe();
  // Unmeasured resident rates (0) price them at nothing; negative ones are refused.
  EXPECT_EQ(plan_co_attention(layer, 16, no_hbm, 55).resident_ms, 0.0);
  r.resident_int8s_gbps = -1;
  EXPECT_THROW(plan_co_attention(layer, 16, r, 55), InvalidArgument);
}

}  // namespace
}  // namespace activekv::route
