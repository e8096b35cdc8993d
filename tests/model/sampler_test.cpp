#include "activekv/model/sampler.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <map>

#include "activekv/core/error.h"
#include "activekv/model/sample_rng.h"

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

// The generator is SplitMix64 as published: the reference splitmix64.c seeded
// with 1234567 gives these five outputs (Rosetta Code lists the same).
TEST(SampleRng, IsSplitMix64) {
  const std::array<uint64_t, 5> want{6457827717110365317ull, 3203168211198807973ull, 9817491932198370423ull,
                                     4593380528125082431ull, 16408922859458223821ull};
  for (uint64_t d = 0; d < want.size(); ++d) EXPECT_EQ(model::sample_bits(1234567, d), want[d]) << "draw " << d;
}

// Uniform on [0, 1): 16 equal bins of 64000 draws each hold 4000 +- 5 sigma
// (sigma = sqrt(4000 * 15/16) ~ 61), and the mean is 0.5 +- 5 sigma.
TEST(SampleRng, UniformIsUniform) {
  const int n = 64000;
  std::array<int, 16> bins{};
  double mean = 0.0;
  for (int d = 0; d < n; ++d) {
    const double u = model::sample_uniform(77, uint64_t(d));
    ASSERT_TRUE(u >= 0.0 && u < 1.0) << u;
    bins[size_t(u * 16)]++;
    mean += u / n;
  }
  for (int b = 0; b < 16; ++b) EXPECT_NEAR(bins[size_t(b)], 4000, 5 * 61) << "bin " << b;
  EXPECT_NEAR(mean, 0.5, 5 * std::sqrt(1.0 / 12 / n));
}

// The k-th call draws sample_uniform(seed, k): with p = (0.75, 0.25) on ids
// (1, 0), the token is 1 exactly when u * (1 + 1/3) < 1, i.e. u < 0.75.
TEST(Sampler, CallNumberIsTheDrawIndex) {
  const std::vector<float> two{0.0f, std::log(3.0f)};
  model::Sampler s({1.0f, 0, 1.0f, 123});
  const double p1 = std::exp(double(0.0f) - double(two[1]));  // the sampler's own p of id 0
  for (uint64_t k = 0; k < 2000; ++k) {
    const double u = model::sample_uniform(123, k) * (1.0 + p1);
    ASSERT_EQ(s.sample(two), u < 1.0 ? 1 : 0) << "call " << k;
  }
  EXPECT_EQ(s.draws(), 2000u);
}

// p = (0.5, 0.3, 0.15, 0.05): top_p 0.75 keeps the first two (mass 0.5, then
// 0.8), which are drawn 0.5/0.8 and 0.3/0.8 of the time.
TEST(Sampler, TopPKeepsTheSmallestPrefixReachingIt) {
  const std::vector<float> l{std::log(0.15f), std::log(0.5f), std::log(0.05f), std::log(0.3f)};
  model::Sampler s({1.0f, 0, 0.75f, 5});
  std::map<int32_t, int> seen;
  const int n = 20000;
  for (int i = 0; i < n; ++i) seen[s.sample(l)]++;
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_NEAR(double(seen[1]) / n, 0.625, 0.02);  // sigma = 0.0034
  EXPECT_GT(seen[3], 0);
}

TEST(Sampler, RejectsBadParameters) {
  EXPECT_THROW(model::Sampler({1.0f, 0, 0.0f, 1}), InvalidArgument);
  EXPECT_THROW(model::Sampler({1.0f, 0, 1.5f, 1}), InvalidArgument);
  EXPECT_THROW(model::Sampler({std::nanf(""), 0, 1.0f, 1}), InvalidArgument);
  model::Sampler s({1.0f, 0, 1.0f, 1});
  EXPECT_THROW(s.sample({}), InvalidArgument);
  EXPECT_EQ(s.draws(), 0u);
}

}  // namespace
}  // namespace activekv
