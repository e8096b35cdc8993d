// int8s attention against its fp64 reference over the dequantised history
// (SPEC §5 own-format error), and the design test: on a 64K-token case with
// outlier key channels a plain per-token 8-bit key quantiser misses the bound
// that the separable int8s format meets.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>

#include "activekv/attention/attention_codecs.h"
#include "activekv/attention/quality.h"
#include "activekv/core/error.h"
#include "codec_attention_util.h"

namespace activekv {
namespace {

using attention::Partial;
using attention::QueryRows;

constexpr double kBound = 0.005;  // SPEC §5

struct Case {
  testing::RawHistory hist;
  std::vector<float> q;
  std::vector<int64_t> pos;
  int heads = 0;
  QueryRows rows() const { return {q.data(), int(pos.size()), heads, pos.data()}; }
};

// Random N(0,1) queries; keys N(0,1) times a channel gain rising linearly
// from 1 to gain_max (gain_max = 1: scores q.k/sqrt(d) of unit spread); values
// with a per-channel mean (as real V has) unless zero_mean_v.
Case random_case(int n_tokens, int H, int d, int heads, std::vector<int64_t> pos, uint32_t seed,
                 bool zero_mean_v = false, float gain_max = 1.0f) {
  Case c;
  c.hist = {n_tokens, H, d, {}, {}};
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> v_mean(static_cast<size_t>(H) * d);
  for (float& m : v_mean) m = zero_mean_v ? 0.0f : n01(rng);
  for (size_t i = 0; i < size_t(n_tokens) * H * d; ++i) {
    c.hist.k.push_back(n01(rng) * (1.0f + (gain_max - 1.0f) * float(i % d) / float(std::max(d - 1, 1))));
    c.hist.v.push_back(v_mean[i % (size_t(H) * d)] + n01(rng));
  }
  c.pos = std::move(pos);
  c.heads = heads;
  c.q.resize(c.pos.size() * heads * d);
  for (float& x : c.q) x = n01(rng);
  return c;
}

double own_error(const Case& c, int page_size, kv::Int8sKeyScaling scaling, Partial* kernel_out = nullptr,
                 int query_terms = 2) {
  const auto pages = testing::encode_history(c.hist, page_size, kv::CodecFormat::int8s, scaling);
  const auto ptrs = testing::pointers(pages);
  attention::AttentionOptions opt;
  opt.int8s_query_terms = query_terms;
  const Partial kernel = attention::attend_int8s_tile(ptrs, 0, c.hist.n_tokens, c.rows(), opt);
  const auto ref = attention::reference_attention(attention::dequantize_history(ptrs, 0, c.hist.n_tokens), c.rows(), {});
  if (kernel_out) *kernel_out = kernel;
  return attention::own_format_error(kernel, ref);
}

TEST(Int8sAttention, RandomDataWithinOwnFormatBound) {
  const Case c = random_case(4000, 2, 64, 8, {3999, 3000, 2048, 1500, 1023, 600, 17, 0}, 31);
  Partial k1, k2;
  const double err = own_error(c, 256, kv::Int8sKeyScaling::separable, &k1);
  std::printf("int8s own-format error, random 4000 tokens (2 KV heads x 64, GQA 4, 8 rows): %.6f\n", err);
  EXPECT_LE(err, kBound);
  EXPECT_GT(err, 0.0);  // the int8 query quantisation is visible, so the check is not vacuous
  // Bitwise repeatable run to run (OpenMP over rows, each row serial).
  own_error(c, 256, kv::Int8sKeyScaling::separable, &k2);
  EXPECT_EQ(std::memcmp(k1.o.data(), k2.o.data(), k1.o.size() * 4), 0);
  EXPECT_EQ(std::memcmp(k1.lse.data(), k2.lse.data(), k1.lse.size() * 4), 0);
}

TEST(Int8sAttention, ZeroMeanValuesAreTheHardCase) {
  // With i.i.d. zero-mean V, |O_ref| shrinks like 1/sqrt(keys attended) while
  // the int8 query rounding error does not shrink with it: the relative error is
  // ~ the score noise itself (~0.006 at d = 64). Printed, not bounded: SPEC §5
  // bounds real KV and the outlier case, whose V is not zero-mean.
  const Case c = random_case(4000, 2, 64, 8, {3999, 3000, 2048, 1500, 1023, 600, 17, 0}, 31, true);
  std::printf("int8s own-format error, random zero-mean V (not bounded): %.6f\n",
              own_error(c, 256, kv::Int8sKeyScaling::separable));
}

TEST(Int8sAttention, HotLogitsAreAHardCase) {
  // Key channel gains 1..5: scores spread ~3x wider, attention is peaky, and
  // the int8 query rounding (an error proportional to the score range) moves
  // O by more. Printed, not bounded; real-KV samples decide (SPEC §5).
  const Case c = random_case(4000, 2, 64, 8, {3999, 3000, 2048, 1500, 1023, 600, 17, 0}, 31, false, 5.0f);
  std::printf("int8s own-format error, random keys with channel gains 1..5 (not bounded): %.6f\n",
              own_error(c, 256, kv::Int8sKeyScaling::separable));
}

TEST(Int8sAttention, IntegerPathIsExactWhenTheQueryIsOnTheInt8Grid) {
  // Unit channel scales and an integer query with max |q| = 127: the row scale
  // is 1 and the int8 query equals q, so only fp32 rounding separates kernel
  // and fp64 reference.
  Case c = random_case(1500, 1, 32, 2, {1499, 700, 100}, 41);
  std::mt19937 rng(5);
  for (size_t i = 0; i < c.q.size(); ++i) c.q[i] = float(int(rng() % 255) - 127);
  for (size_t i = 0; i < c.q.size(); i += 32) c.q[i] = 127.0f;
  attention::AttentionOptions opt;
  opt.softmax_scale = 1.0f / 1024.0f;
  const auto pages = testing::encode_history(c.hist, 512, kv::CodecFormat::int8s, kv::Int8sKeyScaling::per_token_only);
  const auto ptrs = testing::pointers(pages);
  const Partial kernel = attention::attend_int8s_tile(ptrs, 0, 1500, c.rows(), opt);
  const auto ref = attention::reference_attention(attention::dequantize_history(ptrs, 0, 1500), c.rows(), opt);
  EXPECT_LE(attention::own_format_error(kernel, ref), 2e-5);
  for (int r = 0; r < 3; ++r) {
    for (int h = 0; h < 2; ++h) EXPECT_NEAR(kernel.lse_at(r, h), ref.lse_at(r, h), 1e-4);
  }
}

TEST(Int8sAttention, TilesAndCausalRowsMatchReference) {
  const Case c = random_case(2500, 1, 64, 2, {2499, 1800, 1000, 999, 10}, 51);
  const auto pages = testing::encode_history(c.hist, 250, kv::CodecFormat::int8s);
  // Tile = pages 4..7 (tokens 1000..1999): row 999 and row 10 are empty.
  const auto ptrs = testing::pointers(pages, 4, 4);
  const Partial kernel = attention::attend_int8s_tile(ptrs, 1000, 2500, c.rows(), {});
  const auto ref = attention::reference_attention(attention::dequantize_history(ptrs, 1000, 2500), c.rows(), {});
  EXPECT_LE(attention::own_format_error(kernel, ref), kBound);
  for (int h = 0; h < 2; ++h) {
    EXPECT_EQ(kernel.lse_at(3, h), -std::numeric_limits<float>::infinity());
    EXPECT_EQ(kernel.lse_at(4, h), -std::numeric_limits<float>::infinity());
    EXPECT_TRUE(std::isfinite(kernel.lse_at(1, h)));
  }
  // Tiles merged = one tile over everything, up to fp32 merge rounding.
  std::vector<Partial> parts;
  for (size_t fp = 0; fp < pages.size(); fp += 4) {
    parts.push_back(attention::attend_int8s_tile(testing::pointers(pages, fp, 4), int64_t(fp) * 250, 2500,
                                                 c.rows(), {}));
  }
  const auto whole_ref =
      attention::reference_attention(attention::dequantize_history(testing::pointers(pages), 0, 2500), c.rows(), {});
  EXPECT_LE(attention::own_format_error(attention::merge(parts), whole_ref), kBound);
}

// The kernel over views validated beforehand (as published pages are) gives
// the blob kernel's bits: whole and partial tiles, one- and two-term queries.
TEST(Int8sAttention, ViewsGiveTheBlobResultBitwise) {
  const Case c = random_case(1100, 3, 64, 9, {1099, 1023, 700, 256, 3}, 63);
  const auto pages = testing::encode_history(c.hist, 256, kv::CodecFormat::int8s);
  std::vector<kv::Int8sPageView> views;
  for (const kv::EncodedPage& e : pages) views.push_back(kv::parse_int8s_page(e));
  for (int terms : {1, 2}) {
    attention::AttentionOptions opt;
    opt.int8s_query_terms = terms;
    for (auto [fp, np] : {std::pair<size_t, size_t>{0, 5}, {1, 3}, {4, 1}}) {
      SCOPED_TRACE(::testing::Message() << "terms " << terms << ", tile " << fp << "+" << np);
      const Partial blob = attention::attend_int8s_tile(testing::pointers(pages, fp, np), int64_t(fp) * 256,
                                                        c.hist.n_tokens, c.rows(), opt);
      const Partial view = attention::attend_int8s_tile(std::span<const kv::Int8sPageView>(views).subspan(fp, np),
                                                        int64_t(fp) * 256, c.hist.n_tokens, c.rows(), opt);
      ASSERT_EQ(std::memcmp(blob.o.data(), view.o.data(), blob.o.size() * sizeof(float)), 0);
      ASSERT_EQ(std::memcmp(blob.lse.data(), view.lse.data(), blob.lse.size() * sizeof(float)), 0);
    }
  }
}

TEST(Int8sAttention, RejectsBadArguments) {
  const Case c = random_case(300, 1, 16, 2, {299}, 61);
  const auto pages = testing::encode_history(c.hist, 128, kv::CodecFormat::int8s);
  const auto l13 = testing::encode_history(c.hist, 128, kv::CodecFormat::lossless13);
  auto ptrs = testing::pointers(pages);
  EXPECT_THROW(attention::attend_int8s_tile(std::span<const kv::EncodedPage* const>{}, 0, 300, c.rows(), {}),
               InvalidArgument);
  EXPECT_THROW(attention::attend_int8s_tile(std::span<const kv::Int8sPageView>{}, 0, 300, c.rows(), {}),
               InvalidArgument);
  EXPECT_THROW(attention::attend_int8s_tile(testing::pointers(l13), 0, 300, c.rows(), {}), InvalidArgument);
  EXPECT_THROW(attention::attend_lossless13_tile(ptrs, 0, 300, c.rows(), {}), InvalidArgument);
  EXPECT_THROW(attention::attend_int8s_tile(ptrs, 0, 299, c.rows(), {}), InvalidArgument);   // position 299 >= 299
  EXPECT_THROW(attention::attend_int8s_tile(ptrs, 0, 400, c.rows(), {}), InvalidArgument);   // last page holds 44 < 128
  std::vector<const kv::EncodedPage*> with_null{&pages[0], nullptr};
  EXPECT_THROW(attention::attend_int8s_tile(with_null, 0, 300, c.rows(), {}), InvalidArgument);
  const Case two_heads = random_case(300, 2, 16, 3, {299}, 62);  // 3 query heads over 2 KV heads
  const auto two_pages = testing::encode_history(two_heads.hist, 128, kv::CodecFormat::int8s);
  EXPECT_THROW(attention::attend_int8s_tile(testing::pointers(two_pages), 0, 300, two_heads.rows(), {}),
               InvalidArgument);
  EXPECT_THROW(attention::attend_lossless13_tile(testing::pointers(l13, 1), 100, 300, c.rows(), {}), InvalidArgument);
  kv::EncodedPage bad = pages[1];
  bad.bytes.back() ^= std::byte{1};
  std::vector<const kv::EncodedPage*> corrupt{&pages[0], &bad, &pages[2]};
  EXPECT_THROW(attention::attend_int8s_tile(corrupt, 0, 300, c.rows(), {}), Error);
}

// 64K tokens, one KV head x 128 channels; four key channels are 50-100x larger
// than the rest (real K has such channels). Queries are small on those
// channels (x0.1), as trained projections make them so that q.k stays in a
// sane logit range; V has a per-channel mean.
Case outlier_case() {
  const int N = 65536, d = 128;
  Case c;
  c.hist = {N, 1, d, {}, {}};
  std::mt19937 rng(71);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::uniform_real_distribution<float> big(50.0f, 100.0f);
  std::vector<float> gain(static_cast<size_t>(d), 1.0f), v_mean(static_cast<size_t>(d));
  for (int j : {3, 17, 60, 99}) gain[size_t(j)] = big(rng);
  for (float& m : v_mean) m = n01(rng);
  c.hist.k.resize(size_t(N) * d);
  c.hist.v.resize(size_t(N) * d);
  for (size_t i = 0; i < c.hist.k.size(); ++i) {
    c.hist.k[i] = n01(rng) * gain[i % d];
    c.hist.v[i] = v_mean[i % d] + n01(rng);
  }
  c.pos = {N - 1, 50000, 32768, 4000};
  c.heads = 2;
  c.q.resize(c.pos.size() * 2 * d);
  for (size_t i = 0; i < c.q.size(); ++i) c.q[i] = n01(rng) * (gain[i % d] > 1.0f ? 0.1f : 1.0f);
  return c;
}

// With the query in one int8 term (SPEC §3.3 as written) the separable key
// scale is what keeps the error inside the bound: the plain per-token
// quantiser leaves the outlier channels in the key codes' scale. With the
// two-term query (the default) both meet it, since the own-format error does
// not count key rounding (the reference reads the same dequantised keys).
TEST(Int8sAttention, OutlierChannels64KSeparableMeetsBoundPlainPerTokenDoesNot) {
  const Case c = outlier_case();
  const double separable = own_error(c, 1024, kv::Int8sKeyScaling::separable, nullptr, 1);
  const double plain = own_error(c, 1024, kv::Int8sKeyScaling::per_token_only, nullptr, 1);
  std::printf("64K outlier case, one-term int8 query, own-format error: int8s (separable) %.6f, "
              "plain per-token 8-bit %.6f, bound %.3f\n", separable, plain, kBound);
  EXPECT_LE(separable, kBound);
  EXPECT_GT(plain, kBound);
  const double separable2 = own_error(c, 1024, kv::Int8sKeyScaling::separable);
  const double plain2 = own_error(c, 1024, kv::Int8sKeyScaling::per_token_only);
  std::printf("64K outlier case, two-term int8 query: int8s %.6f, plain per-token %.6f\n", separable2, plain2);
  EXPECT_LE(separable2, separable);
}

}  // namespace
}  // namespace activekv
