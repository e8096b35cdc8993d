// GPU tests of the tc int8s kernel's building blocks (issue 13): one
// 16-token block through its fragment helpers (src/cuda/int8s_tc_fragments.cuh,
// via int8s_tc_selftest.h) against plain loops, so that a fragment-layout
// mistake fails here and names the row/token/channel, and its argument
// errors. The whole kernel against the CPU reference is in test_formats.cpp
// (Int8sTile/*, FormatRoutes.TcKernel*). Labelled `gpu`.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <tuple>
#include <vector>

#include "activekv/cuda/format_kernels.h"
#include "gpu_test_util.h"
#include "int8s_tc_selftest.h"

namespace activekv::cuda {
namespace {

// Codes over the whole int8s range, the extremes +-127 and 0 included.
std::vector<int8_t> random_codes(size_t n, uint32_t seed) {
  std::mt19937 rng{seed};
  std::vector<int8_t> c(n);
  for (size_t i = 0; i < n; ++i) c[i] = int8_t(int(rng() % 255) - 127);
  c[0] = 127;
  c[1] = -127;
  c[2] = 0;
  return c;
}

// (head_dim, P.V in channel rows: pv_block_t instead of pv_block)
class Int8sTcFragments : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(Int8sTcFragments, QkMatchesIntegerDotProducts) {
  NEED_GPU();
  const int hd = std::get<0>(GetParam());  // q.k does not depend on the P.V form
  const std::vector<int8_t> q = random_codes(size_t(16) * hd, 1), k = random_codes(size_t(16) * hd, 2);
  const std::vector<int32_t> got = selftest::int8s_tc_qk_block(hd, q, k);
  for (int r = 0; r < 16; ++r)
    for (int t = 0; t < 16; ++t) {
      int32_t want = 0;
      for (int j = 0; j < hd; ++j) want += int32_t(q[size_t(r) * hd + j]) * int32_t(k[size_t(t) * hd + j]);
      ASSERT_EQ(got[size_t(r) * 16 + t], want) << "head_dim " << hd << ", query row " << r << ", token " << t;
    }
}

// p = i / 16 is one f16 term (lo = 0), and every product and sum is an
// integer multiple of 2^-4 below 2^11, exact in fp32: the result is exact.
TEST_P(Int8sTcFragments, PvExactOnExactWeights) {
  NEED_GPU();
  const auto [hd, channel_rows] = GetParam();
  const std::vector<int8_t> v = random_codes(size_t(16) * hd, 3);
  std::mt19937 rng{4};
  std::vector<float> p(8 * 16);
  for (auto& x : p) x = float(rng() % 17) / 16.f;
  const std::vector<float> got = selftest::int8s_tc_pv_block(hd, p, v, channel_rows);
  for (int g = 0; g < 8; ++g)
    for (int c = 0; c < hd; ++c) {
      float want = 0;
      for (int t = 0; t < 16; ++t) want += p[size_t(g) * 16 + t] * float(v[size_t(t) * hd + c]);
      ASSERT_EQ(got[size_t(g) * hd + c], want)
          << "head_dim " << hd << (channel_rows ? " (channel rows)" : "") << ", head " << g << ", channel " << c;
    }
}

// Weights of full fp32 precision: the two f16 terms of p * 2^12 carry p to
// <= 2^-22 relative (+ 2^-37 absolute), and fp32 accumulation of 16 products
// on the tensor cores adds <= ~16 * 2^-23 relative to sum |p v| (a linear
// bound, truncating adds). Bound asserted: 1e-5 * sum |p v| + 1e-9 (a mapping
// mistake gives errors of the order of sum |p v| itself). The measured worst
// ratio is printed for the lead to tighten.
TEST_P(Int8sTcFragments, PvTwoTermWeightsWithinDerivedBound) {
  NEED_GPU();
  const auto [hd, channel_rows] = GetParam();
  const std::vector<int8_t> v = random_codes(size_t(16) * hd, 5);
  std::mt19937 rng{6};
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::vector<float> p(8 * 16);
  for (size_t i = 0; i < p.size(); ++i) p[i] = i % 7 == 0 ? std::ldexp(u(rng), -int(rng() % 30)) : u(rng);
  p[3] = 1.f;
  p[5] = 0.f;
  const std::vector<float> got = selftest::int8s_tc_pv_block(hd, p, v, channel_rows);
  double worst = 0;
  for (int g = 0; g < 8; ++g)
    for (int c = 0; c < hd; ++c) {
      double want = 0, mag = 0;
      for (int t = 0; t < 16; ++t) {
        const double pv = double(p[size_t(g) * 16 + t]) * double(v[size_t(t) * hd + c]);
        want += pv;
        mag += std::fabs(pv);
      }
      const double err = std::fabs(double(got[size_t(g) * hd + c]) - want);
      worst = std::max(worst, err / (mag + 1e-30));
      ASSERT_LE(err, 1e-5 * mag + 1e-9)
          << "head_dim " << hd << (channel_rows ? " (channel rows)" : "") << ", head " << g << ", channel " << c;
    }
  std::printf("  head_dim %d%s: P.V two-term f16 weights, worst |error| / sum|p v| = %.2e\n", hd,
              channel_rows ? " (channel rows)" : "", worst);
}

INSTANTIATE_TEST_SUITE_P(HeadDims, Int8sTcFragments, ::testing::Combine(::testing::Values(64, 256), ::testing::Bool()));

TEST(Int8sTcKernel, RejectsGroupsItIsNotInstantiatedFor) {
  // Thrown before any device work: no GPU needed.
  AttnShape sh{2, 2, 64, 64, 32, 0.f};
  Int8sKernelOptions opt;
  opt.kernel = Int8sKernel::tc;
  SplitWork dummy;
  const Partials parts{nullptr, nullptr, 1};
  for (int group : {1, 2, 5}) {
    sh.group = group;
    try {
      launch_split_attention_int8s(sh, &dummy, 1, nullptr, parts, opt, nullptr);
      ADD_FAILURE() << "group " << group << " accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("query heads per KV head is not instantiated"), std::string::npos)
          << e.what();
    }
  }
  sh.group = 3;
  sh.page_size = 8192;
  sh.split_tokens = 8192;
  EXPECT_THROW(launch_split_attention_int8s(sh, &dummy, 1, nullptr, parts, opt, nullptr), InvalidArgument)
      << "splits over 4096 tokens";
}

TEST(Int8sTcKernel, KernelNamesParse) {
  EXPECT_EQ(parse_int8s_kernel("tc"), Int8sKernel::tc);
  EXPECT_EQ(parse_int8s_kernel("legacy"), Int8sKernel::legacy);
  EXPECT_STREQ(int8s_kernel_name(Int8sKernel::tc), "tc");
  EXPECT_STREQ(int8s_kernel_name(Int8sKernel::legacy), "legacy");
  EXPECT_THROW(parse_int8s_kernel("fast"), InvalidArgument);
  // auto (the default) is tc where the shape allows it, else legacy.
  EXPECT_EQ(parse_int8s_kernel("auto"), Int8sKernel::automatic);
  EXPECT_EQ(Int8sKernelOptions{}.kernel, Int8sKernel::automatic);
  AttnShape sh{4, 6, 256, 1024, 512, 0.f};
  EXPECT_EQ(resolve_int8s_kernel(Int8sKernel::automatic, sh), Int8sKernel::tc);
  EXPECT_EQ(resolve_int8s_kernel(Int8sKernel::legacy, sh), Int8sKernel::legacy);
  sh.group = 5;
  EXPECT_EQ(resolve_int8s_kernel(Int8sKernel::automatic, sh), Int8sKernel::legacy);
  sh.group = 6;
  sh.page_size = sh.split_tokens = 8192;
  EXPECT_EQ(resolve_int8s_kernel(Int8sKernel::automatic, sh), Int8sKernel::legacy);
}

}  // namespace
}  // namespace activekv::cuda
