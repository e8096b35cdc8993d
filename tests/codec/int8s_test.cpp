// int8s: the quantiser against an independent transcription of SPEC §3.3, and
// its edge cases (zero channel, zero token, clamp bounds, +-127 clip, ties).
#include "activekv/kv/codec_int8s.h"

#include <gtest/gtest.h>

#include <cmath>

#include "../../src/codec/internal.h"
#include "activekv/core/error.h"
#include "codec_test_util.h"

namespace activekv {
namespace {

using kv::detail::double_to_half;
using kv::detail::half_to_float;

double to_fp16(double x) { return double(static_cast<_Float16>(x)); }  // the compiler's RNE conversion

TEST(Int8sFp16, ConversionMatchesCompilerAndIsExactOnAllHalves) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = half_to_float(uint16_t(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(double_to_half(f), h) << h;
    ASSERT_EQ(std::bit_cast<uint16_t>(static_cast<_Float16>(f)), h) << h;
  }
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> e(-30, 17), m(1, 2);
  for (int i = 0; i < 200000; ++i) {
    const double x = std::ldexp(m(rng), int(e(rng))) * (i % 2 ? -1 : 1);
    ASSERT_EQ(double_to_half(x), std::bit_cast<uint16_t>(static_cast<_Float16>(x))) << x;
  }
  // Ties: halfway between 1 and 1 + 2^-10 rounds to even (1); 65520 rounds to inf.
  EXPECT_EQ(double_to_half(1.0 + 0x1p-11), 0x3c00);
  EXPECT_EQ(double_to_half(1.0 + 3 * 0x1p-11), 0x3c02);
  EXPECT_EQ(double_to_half(65520.0), 0x7c00);
  EXPECT_EQ(double_to_half(0x1p-25), 0x0000);  // tie between 0 and the smallest subnormal
}

// Transcription of SPEC §3.3 for one head, in double.
struct Expected {
  std::vector<double> c, s, v;
  std::vector<int> kq, vq;
};

Expected spec_int8s(const kv::KvShape& sh, const std::vector<bf16>& page, int head, int n) {
  const int d = sh.head_dim;
  auto K = [&](int t, int j) { return double(bf16_to_f32(page[testing::at(sh, head, t, j)])); };
  auto V = [&](int t, int j) { return double(bf16_to_f32(page[testing::at(sh, sh.n_kv_heads + head, t, j)])); };
  auto rhe = [](double x, double sc) { return sc == 0 ? 0 : int(std::clamp(std::nearbyint(x / sc), -127.0, 127.0)); };
  Expected e;
  std::vector<double> c(static_cast<size_t>(d));
  double logsum = 0;
  int nz = 0;
  for (int j = 0; j < d; ++j) {
    double sq = 0;
    for (int t = 0; t < n; ++t) sq += K(t, j) * K(t, j);
    c[size_t(j)] = std::sqrt(std::sqrt(sq / n));
    if (c[size_t(j)] > 0) logsum += std::log(c[size_t(j)]), ++nz;
  }
  const double g = nz ? std::exp(logsum / nz) : 1.0;
  for (int j = 0; j < d; ++j) {
    e.c.push_back(c[size_t(j)] > 0 ? to_fp16(std::clamp(c[size_t(j)] / g, 0x1p-14, 0x1p14)) : 1.0);
  }
  for (int t = 0; t < n; ++t) {
    double m = 0;
    for (int j = 0; j < d; ++j) m = std::max(m, std::fabs(K(t, j)) / e.c[size_t(j)]);
    e.s.push_back(to_fp16(m / 127));
    for (int j = 0; j < d; ++j) e.kq.push_back(rhe(K(t, j), e.c[size_t(j)] * e.s.back()));
  }
  for (int j = 0; j < d; ++j) {
    double m = 0;
    for (int t = 0; t < n; ++t) m = std::max(m, std::fabs(V(t, j)));
    e.v.push_back(to_fp16(m / 127));
  }
  for (int t = 0; t < n; ++t) {
    for (int j = 0; j < d; ++j) e.vq.push_back(rhe(V(t, j), e.v[size_t(j)]));
  }
  return e;
}

void expect_matches_spec(const kv::KvShape& sh, const std::vector<bf16>& page, int n) {
  const kv::EncodedPage enc = kv::encode_int8s_page(sh, page, n);
  const kv::Int8sPageView view = kv::parse_int8s_page(enc);
  for (int h = 0; h < sh.n_kv_heads; ++h) {
    const Expected e = spec_int8s(sh, page, h, n);
    const kv::Int8sHeadView hv = view.head(h);
    for (int j = 0; j < sh.head_dim; ++j) {
      ASSERT_EQ(hv.c(size_t(j)), e.c[size_t(j)]) << "c " << j;
      ASSERT_EQ(hv.v(size_t(j)), e.v[size_t(j)]) << "v " << j;
    }
    for (int t = 0; t < n; ++t) ASSERT_EQ(hv.s(size_t(t)), e.s[size_t(t)]) << "s " << t;
    for (size_t i = 0; i < e.kq.size(); ++i) {
      ASSERT_EQ(hv.kq[i], e.kq[i]) << "kq " << i;
      ASSERT_EQ(hv.vq[i], e.vq[i]) << "vq " << i;
    }
  }
}

TEST(Int8s, RandomPagesMatchSpecTranscription) {
  const auto sh = testing::codec_shape(256, 2, 64);
  for (int n : {256, 100, 1}) expect_matches_spec(sh, testing::random_page(sh, uint32_t(n)), n);
}

TEST(Int8s, ChannelScalesHaveUnitProductAndDequantisationIsWithinHalfStep) {
  const auto sh = testing::codec_shape(512, 1, 128);
  auto page = testing::random_page(sh, 11);
  for (int t = 0; t < 512; ++t) page[testing::at(sh, 0, t, 5)] = f32_to_bf16(80.0f * bf16_to_f32(page[testing::at(sh, 0, t, 5)]));
  const kv::EncodedPage enc = kv::encode_int8s_page(sh, page, 512);
  const kv::Int8sPageView view = kv::parse_int8s_page(enc);
  const kv::Int8sHeadView hv = view.head(0);
  double logprod = 0;
  for (size_t j = 0; j < 128; ++j) logprod += std::log2(double(hv.c(j)));
  EXPECT_NEAR(logprod, 0.0, 128 * 0x1p-11);  // prod c = 1 up to fp16 rounding of each c_j
  std::vector<float> deq(sh.page_elements());
  kv::decode_page_f32(enc, deq);
  for (int t = 0; t < 512; ++t) {
    int max_code = 0;
    for (int j = 0; j < 128; ++j) {
      const size_t i = size_t(t) * 128 + j;
      const double step = double(hv.c(size_t(j))) * hv.s(size_t(t));
      ASSERT_EQ(double(deq[i]), double(float(step * hv.kq[i])));
      ASSERT_LE(std::fabs(double(bf16_to_f32(page[i])) - step * hv.kq[i]), 0.5 * step * (1 + 1e-3) + 1e-30);
      max_code = std::max(max_code, std::abs(int(hv.kq[i])));
    }
    EXPECT_GE(max_code, 126) << "token " << t;  // the token's largest |K/c| uses the full range
  }
}

TEST(Int8s, ZeroChannelGetsUnitScaleAndZeroToken) {
  const auto sh = testing::codec_shape(64, 1, 16);
  auto page = testing::random_page(sh, 4);
  for (int t = 0; t < 64; ++t) page[testing::at(sh, 0, t, 3)] = bf16{0x8000};  // -0: still a zero channel
  for (int j = 0; j < 16; ++j) page[testing::at(sh, 0, 9, j)] = bf16{0};       // zero key token
  for (int t = 0; t < 64; ++t) page[testing::at(sh, 1, t, 7)] = bf16{0};       // zero value channel
  const kv::EncodedPage view_enc = kv::encode_int8s_page(sh, page, 64);
  const kv::Int8sPageView view = kv::parse_int8s_page(view_enc);
  const kv::Int8sHeadView hv = view.head(0);
  EXPECT_EQ(hv.c(3), 1.0f);
  EXPECT_EQ(hv.s(9), 0.0f);
  EXPECT_EQ(hv.v(7), 0.0f);
  for (int t = 0; t < 64; ++t) {
    EXPECT_EQ(hv.kq[size_t(t) * 16 + 3], 0);
    EXPECT_EQ(hv.vq[size_t(t) * 16 + 7], 0);
  }
  for (int j = 0; j < 16; ++j) EXPECT_EQ(hv.kq[size_t(9) * 16 + j], 0);
  expect_matches_spec(sh, page, 64);
  // An all-zero page: every scale neutral, every code zero.
  std::vector<bf16> zero(sh.page_elements());
  const kv::EncodedPage z_enc = kv::encode_int8s_page(sh, zero, 64);
  const kv::Int8sPageView z = kv::parse_int8s_page(z_enc);
  for (size_t j = 0; j < 16; ++j) EXPECT_EQ(z.head(0).c(j), 1.0f);
  for (size_t t = 0; t < 64; ++t) EXPECT_EQ(z.head(0).s(t), 0.0f);
}

TEST(Int8s, ChannelScaleClampsToBothBounds) {
  // c0 = sqrt(2^30) = 2^15, c1 = sqrt(2^-34) = 2^-17, geometric mean 2^-1:
  // c0 / g = 2^16 clamps to 2^14, c1 / g = 2^-16 clamps to 2^-14.
  const auto sh = testing::codec_shape(4, 1, 2);
  std::vector<bf16> page(sh.page_elements());
  for (int t = 0; t < 4; ++t) {
    page[testing::at(sh, 0, t, 0)] = f32_to_bf16((t % 2 ? -1.0f : 1.0f) * 0x1p30f);
    page[testing::at(sh, 0, t, 1)] = f32_to_bf16(0x1p-34f);
  }
  const kv::EncodedPage view_enc = kv::encode_int8s_page(sh, page, 4);
  const kv::Int8sPageView view = kv::parse_int8s_page(view_enc);
  EXPECT_EQ(view.head(0).c(0), 0x1p14f);
  EXPECT_EQ(view.head(0).c(1), 0x1p-14f);
  EXPECT_EQ(view.head(0).kq[0], 127);
  EXPECT_EQ(view.head(0).kq[2], -127);
  expect_matches_spec(sh, page, 4);
}

TEST(Int8s, CodesClipAt127WhenTheTokenScaleRoundsDown) {
  // Two identical channels (c = 1). Token scale 178/127 * 2^-24 is an fp16
  // subnormal that rounds down to 2^-24, so 178 * 2^-24 / s = 178 clips to 127.
  const auto sh = testing::codec_shape(4, 1, 2);
  std::vector<bf16> page(sh.page_elements());
  const float x = 178.0f * 0x1p-24f;
  const float row[4] = {x, -x, 1.0f, -1.0f};
  for (int t = 0; t < 4; ++t) {
    page[testing::at(sh, 0, t, 0)] = f32_to_bf16(row[t]);
    page[testing::at(sh, 0, t, 1)] = f32_to_bf16(row[t]);
  }
  const kv::EncodedPage view_enc = kv::encode_int8s_page(sh, page, 4);
  const kv::Int8sPageView view = kv::parse_int8s_page(view_enc);
  const kv::Int8sHeadView hv = view.head(0);
  ASSERT_EQ(hv.c(0), 1.0f);
  EXPECT_EQ(hv.s(0), 0x1p-24f);
  EXPECT_EQ(hv.kq[0], 127);
  EXPECT_EQ(hv.kq[1], 127);
  EXPECT_EQ(hv.kq[2], -127);
  EXPECT_EQ(hv.kq[3], -127);
  expect_matches_spec(sh, page, 4);
}

TEST(Int8s, TiesRoundToEven) {
  // Channels hold the same multiset of values (c = 1); every token's max is
  // 127/128, so s = 1/128 and the other entry k/128 codes to round_half_even(k).
  const double half[] = {0.5, 1.5, 2.5, 3.5, -0.5, -1.5, -2.5, -3.5};
  const int want[] = {0, 2, 2, 4, 0, -2, -2, -4};
  const auto sh = testing::codec_shape(16, 1, 2);
  std::vector<bf16> page(sh.page_elements());
  for (int i = 0; i < 8; ++i) {
    for (int side = 0; side < 2; ++side) {
      const int t = 2 * i + side;
      page[testing::at(sh, 0, t, side)] = f32_to_bf16(127.0f / 128);
      page[testing::at(sh, 0, t, 1 - side)] = f32_to_bf16(float(half[i] / 128));
      page[testing::at(sh, 1, t, side)] = f32_to_bf16(127.0f / 128);
      page[testing::at(sh, 1, t, 1 - side)] = f32_to_bf16(float(half[i] / 128));
    }
  }
  const kv::EncodedPage view_enc = kv::encode_int8s_page(sh, page, 16);
  const kv::Int8sPageView view = kv::parse_int8s_page(view_enc);
  const kv::Int8sHeadView hv = view.head(0);
  ASSERT_EQ(hv.c(0), 1.0f);
  ASSERT_EQ(hv.c(1), 1.0f);
  ASSERT_EQ(hv.v(0), 1.0f / 128);
  for (int i = 0; i < 8; ++i) {
    for (int side = 0; side < 2; ++side) {
      const int t = 2 * i + side;
      EXPECT_EQ(hv.s(size_t(t)), 1.0f / 128);
      EXPECT_EQ(hv.kq[size_t(t) * 2 + side], 127);
      EXPECT_EQ(hv.kq[size_t(t) * 2 + 1 - side], want[i]) << half[i];
      EXPECT_EQ(hv.vq[size_t(t) * 2 + 1 - side], want[i]) << half[i];
    }
  }
}

TEST(Int8s, PerTokenOnlyScalingHasUnitChannelScales) {
  const auto sh = testing::codec_shape(64, 1, 32);
  const auto page = testing::random_page(sh, 5);
  const kv::EncodedPage view_enc = kv::encode_int8s_page(sh, page, 64, kv::Int8sKeyScaling::per_token_only);
  const kv::Int8sPageView view = kv::parse_int8s_page(view_enc);
  for (size_t j = 0; j < 32; ++j) EXPECT_EQ(view.head(0).c(j), 1.0f);
  for (int t = 0; t < 64; ++t) {
    double m = 0;
    for (int j = 0; j < 32; ++j) m = std::max(m, std::fabs(double(bf16_to_f32(page[testing::at(sh, 0, t, j)]))));
    EXPECT_EQ(view.head(0).s(size_t(t)), to_fp16(m / 127));
  }
}

TEST(Int8s, EncoderRejectsNonFiniteAndOverflowingInput) {
  const auto sh = testing::codec_shape(8, 1, 4);
  auto page = testing::random_page(sh, 6);
  page[testing::at(sh, 0, 2, 1)] = bf16{0x7f80};  // +inf in K
  EXPECT_THROW(kv::encode_int8s_page(sh, page, 8), InvalidArgument);
  page = testing::random_page(sh, 6);
  page[testing::at(sh, 1, 2, 1)] = bf16{0x7fc1};  // NaN in V
  EXPECT_THROW(kv::encode_int8s_page(sh, page, 8), InvalidArgument);
  page = testing::random_page(sh, 6);
  page[testing::at(sh, 1, 2, 1)] = f32_to_bf16(1e7f);  // v = 1e7/127 > 65504
  EXPECT_THROW(kv::encode_int8s_page(sh, page, 8), InvalidArgument);
  page = testing::random_page(sh, 6);
  // The token beyond n_tokens is never read: a NaN there is fine.
  page[testing::at(sh, 0, 7, 0)] = bf16{0x7fc0};
  EXPECT_NO_THROW(kv::encode_int8s_page(sh, page, 7));
  EXPECT_THROW(kv::encode_int8s_page(sh, page, 0), InvalidArgument);
  EXPECT_THROW(kv::encode_int8s_page(sh, page, 9), InvalidArgument);
}

}  // namespace
}  // namespace activekv
