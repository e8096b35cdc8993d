#include "activekv/route/placement.h"

#include <gtest/gtest.h>

#include "activekv/core/error.h"

namespace activekv::route {
namespace {

constexpr size_t GiB = size_t(1) << 30;

TEST(Placement, AutoPicksGpuOnlyWhenTheHistoryFits) {  // else partial (room past the tails: none counted here)
  EXPECT_EQ(choose_placement(KvPlacement::automatic, 2 * GiB, 3 * GiB).placement, KvPlacement::gpu);
  EXPECT_EQ(choose_placement(KvPlacement::automatic, 3 * GiB, 3 * GiB).placement, KvPlacement::gpu);
  const PlacementChoice c = choose_placement(KvPlacement::automatic, 3 * GiB + 1, 3 * GiB);
  EXPECT_EQ(c.placement, KvPlacement::partial);
  EXPECT_NE(c.reason.find("exceeds"), std::string::npos) << c.reason;
}

TEST(Placement, HostIsAlwaysHostAndGpuThatDoesNotFitSaysBothSizes) {
  EXPECT_EQ(choose_placement(KvPlacement::host, 1, 100 * GiB).placement, KvPlacement::host);
  EXPECT_EQ(choose_placement(KvPlacement::gpu, GiB, 2 * GiB).placement, KvPlacement::gpu);
  try {
    choose_placement(KvPlacement::gpu, 5 * GiB, 2 * GiB);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("5.00 GiB"), std::string::npos) << m;
    EXPECT_NE(m.find("2.00 GiB"), std::string::npos) << m;
  }
}

TEST(Placement, DefaultBudgetKeepsAMargin) {
  EXPECT_EQ(gpu_margin_bytes(8 * GiB), GiB);               // 5 % of 8 GiB < 1 GiB
  EXPECT_EQ(gpu_margin_bytes(140 * GiB), 7 * GiB);         // 5 % of 140 GiB
  EXPECT_EQ(default_gpu_kv_budget(100 * GiB, 140 * GiB), 93 * GiB);
  EXPECT_EQ(default_gpu_kv_budget(GiB / 2, 8 * GiB), 0u);  // less free than the margin
}

TEST(Placement, NamesRoundTrip) {
  for (KvPlacement p : {KvPlacement::host, KvPlacement::gpu, KvPlacement::partial, KvPlacement::automatic})
    EXPECT_EQ(parse_placement(placement_name(p)), p);
  EXPECT_THROW(parse_placement("cpu"), InvalidArgument);
}

}  // namespace
}  // namespace activekv::route
