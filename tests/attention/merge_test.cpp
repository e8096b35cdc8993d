// The LSE merge (SPEC §4): equals single-pass attention over the union of keys.
#include <gtest/gtest.h>

#include <limits>
#include <random>

#include "activekv/attention/partial.h"
#include "activekv/attention/quality.h"
#include "activekv/core/error.h"

namespace activekv {
namespace {

using attention::DenseHistoryF64;
using attention::Partial;

DenseHistoryF64 random_history(int n, int kv_heads, int dim, std::mt19937& rng) {
  std::normal_distribution<double> n01(0.0, 2.0);
  DenseHistoryF64 h;
  h.n_kv_heads = kv_heads;
  h.head_dim = dim;
  h.n_tokens = n;
  for (int i = 0; i < n * kv_heads * dim; ++i) {
    h.k.push_back(n01(rng));
    h.v.push_back(n01(rng));
  }
  return h;
}

// Partial over keys [b, e) of the history's last row, from the fp64
// reference (attention::reference_attention) rounded to fp32.
Partial partial_of(const DenseHistoryF64& h, const std::vector<float>& q, int heads, int b, int e) {
  const size_t row = size_t(h.n_kv_heads) * h.head_dim;
  DenseHistoryF64 keys = h;  // keys [b, e) only, at their positions
  keys.first_token = b;
  keys.n_tokens = e - b;
  keys.k.assign(h.k.begin() + ptrdiff_t(b * row), h.k.begin() + ptrdiff_t(e * row));
  keys.v.assign(h.v.begin() + ptrdiff_t(b * row), h.v.begin() + ptrdiff_t(e * row));
  const int64_t pos = h.n_tokens - 1;
  attention::AttentionOptions opt;
  opt.softmax_scale = 0.125f;
  const attention::ReferencePartial ref = attention::reference_attention(keys, {q.data(), 1, heads, &pos}, opt);
  Partial p(1, heads, h.head_dim);
  for (size_t i = 0; i < ref.o.size(); ++i) p.o[i] = float(ref.o[i]);
  for (size_t i = 0; i < ref.lse.size(); ++i) p.lse[i] = float(ref.lse[i]);
  return p;
}

TEST(Merge, RandomSplitsEqualSinglePass) {
  std::mt19937 rng(42);
  for (int trial = 0; trial < 20; ++trial) {
    const int n = 50 + int(rng() % 400), heads = 4;
    auto h = random_history(n, 2, 16, rng);
    std::vector<float> q(size_t(heads) * 16);
    std::normal_distribution<float> n01;
    for (float& x : q) x = n01(rng);
    // Random cut points -> ascending partials covering [0, n).
    std::vector<int> cuts{0, n};
    const int n_cuts = 1 + int(rng() % 8);
    for (int c = 0; c < n_cuts; ++c) cuts.push_back(int(rng() % uint32_t(n)));
    std::sort(cuts.begin(), cuts.end());
    std::vector<Partial> parts;
    for (size_t i = 0; i + 1 < cuts.size(); ++i) parts.push_back(partial_of(h, q, heads, cuts[i], cuts[i + 1]));
    const Partial merged = attention::merge(parts);
    const Partial whole = partial_of(h, q, heads, 0, n);
    for (size_t i = 0; i < whole.o.size(); ++i) EXPECT_NEAR(merged.o[i], whole.o[i], 2e-6 * (1 + std::abs(whole.o[i])));
    for (size_t i = 0; i < whole.lse.size(); ++i) EXPECT_NEAR(merged.lse[i], whole.lse[i], 2e-6 * (1 + std::abs(whole.lse[i])));
  }
}

TEST(Merge, EmptyPartialWithNanOutputIsSkipped) {
  std::mt19937 rng(7);
  auto h = random_history(100, 1, 8, rng);
  std::vector<float> q(16, 0.5f);
  std::vector<Partial> parts{partial_of(h, q, 2, 0, 60), Partial(1, 2, 8), partial_of(h, q, 2, 60, 100)};
  std::fill(parts[1].o.begin(), parts[1].o.end(), std::numeric_limits<float>::quiet_NaN());
  const Partial merged = attention::merge(parts);
  const Partial whole = partial_of(h, q, 2, 0, 100);
  for (size_t i = 0; i < whole.o.size(); ++i) {
    ASSERT_FALSE(std::isnan(merged.o[i]));
    EXPECT_NEAR(merged.o[i], whole.o[i], 1e-5);
  }
}

TEST(Merge, AllEmptyStaysEmpty) {
  std::vector<Partial> parts{Partial(2, 1, 4), Partial(2, 1, 4)};
  const Partial merged = attention::merge(parts);
  for (float l : merged.lse) EXPECT_EQ(l, -std::numeric_limits<float>::infinity());
  for (float o : merged.o) EXPECT_EQ(o, 0.0f);
}

TEST(Merge, SinglePartialIsReturnedUnchanged) {
  Partial p(1, 1, 3);
  p.o = {1.0f, std::nextafter(2.0f, 3.0f), 3.0f};
  p.lse = {0.3f};
  const Partial m = attention::merge(std::vector<Partial>{p});
  EXPECT_EQ(m.o, p.o);
  EXPECT_EQ(m.lse, p.lse);
}

TEST(Merge, ShapeMismatchAndEmptyListThrow) {
  EXPECT_THROW(attention::merge(std::vector<Partial>{}), InvalidArgument);
  EXPECT_THROW(attention::merge(std::vector<Partial>{Partial(1, 2, 4), Partial(1, 2, 8)}), InvalidArgument);
}

}  // namespace
}  // namespace activekv
