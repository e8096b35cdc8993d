#include "activekv/model/sampler.h"

#include <gtest/gtest.h>

#include <map>

#include "activekv/core/error.h"

namespace activekv {
namespace {

const std::vector<float> kLogits{1.0f, 3.0f, 2.5f, -1.0f, 3.0f, 0.0f};

TEST(Sampler, GreedyIsArgmaxLowestIdOnTies) {
  model::Sampler s({0.0f, 40, 0.95f, 1});
  EXPECT_EQ(s.sample(kLogits), 1);
  EXPECT_EQ(model::argmax(kLogits), 1);
}

TEST(Sampler, SameSeedSameTokensOtherSeedDiffers) {
  auto draw = [](uint64_t seed) {
    model::Sampler s({1.0f, 0, 1.0f, seed});
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(kLogits));
    return out;
  };
  EXPECT_EQ(draw(5), draw(5));
  EXPECT_NE(draw(5), draw(6));
}

TEST(Sampler, TopKOneAndTinyTopPAreGreedy) {
  model::Sampler k1({1.0f, 1, 1.0f, 3});
  model::Sampler p0({1.0f, 0, 1e-6f, 3});
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(k1.sample(kLogits), 1);
    EXPECT_EQ(p0.sample(kLogits), 1);
  }
}

TEST(Sampler, TopKLimitsTheCandidates) {
  model::Sampler s({5.0f, 3, 1.0f, 9});  // hot: all of the top 3 should appear, nothing else
  std::map<int32_t, int> seen;
  for (int i = 0; i < 2000; ++i) seen[s.sample(kLogits)]++;
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_TRUE(seen.count(1) && seen.count(4) && seen.count(2));
}

TEST(Sampler, FrequenciesFollowTheSoftmax) {
  const std::vector<float> two{0.0f, std::log(3.0f)};  // p = 0.25, 0.75
  model::Sampler s({1.0f, 0, 1.0f, 11});
  int ones = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ones += s.sample(two);
  EXPECT_NEAR(double(ones) / n, 0.75, 0.015);
}

TEST(Sampler, RejectsBadParameters) {
  EXPECT_THROW(model::Sampler({1.0f, 0, 0.0f, 1}), InvalidArgument);
  EXPECT_THROW(model::Sampler({1.0f, 0, 1.5f, 1}), InvalidArgument);
  EXPECT_THROW(model::Sampler({std::nanf(""), 0, 1.0f, 1}), InvalidArgument);
}

}  // namespace
}  // namespace activekv
