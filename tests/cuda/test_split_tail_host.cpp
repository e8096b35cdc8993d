// The split attention kernel's tail (src/cuda/split_tail.cuh) on the CPU:
// merge weights computed once per head give every output and LSE bit for
// bit what the per-output form the kernel had before gives (each output
// recomputing M, the W exp2 and L) -- warps that saw no token (m = -inf),
// weights that underflow to 0, and heads with no token at all included. So
// the kernel's partials keep their bits; the GPU tests (cuda_decode) check
// the kernel against the fp64 reference and its bitwise contracts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "split_tail.cuh"

namespace activekv::cuda {
namespace {

constexpr float kLn2 = 0.6931471805599453f;  // as mma_util.cuh

/// W warp states of one head, laid out as the kernel's shared memory: m and l
/// at [i * stride], acc at [i * acc_stride + c].
struct WarpStates {
  int w = 0, hd = 0;
  std::vector<float> m, l, acc;
};

/// The per-output form (the kernel's tail before split_tail.cuh), in warp
/// order `order` (the identity, or reversed for the control below).
void per_output(const WarpStates& s, const std::vector<int>& order, std::vector<float>& out, float& lse) {
  out.assign(s.hd, 0.f);
  for (int c = 0; c < s.hd; ++c) {
    float M = -INFINITY;
    for (int i : order) M = fmaxf(M, s.m[i]);
    float L = 0.f, O = 0.f;
    if (M != -INFINITY) {
      for (int i : order) {
        const float mi = s.m[i];
        if (mi == -INFINITY) continue;
        const float sc = exp2f(mi - M);
        L = fmaf(sc, s.l[i], L);
        O = fmaf(sc, s.acc[size_t(i) * s.hd + c], O);
      }
    }
    out[c] = M == -INFINITY ? 0.f : O / L;
    if (c == 0) lse = M == -INFINITY ? -INFINITY : (M + log2f(L)) * kLn2;
  }
}

template <int W>
void merged(const WarpStates& s, std::vector<float>& out, float& lse) {
  const split_tail::HeadMerge<W> hm = split_tail::head_merge<W>(s.m.data(), s.l.data(), 1);
  out.assign(s.hd, 0.f);
  for (int c = 0; c < s.hd; ++c) out[c] = split_tail::merged_output<W>(hm, s.acc.data() + c, s.hd);
  lse = split_tail::merged_lse(hm, kLn2);
}

WarpStates random_states(int w, int hd, std::mt19937& rng, int kind) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  WarpStates s{w, hd, std::vector<float>(w), std::vector<float>(w), std::vector<float>(size_t(w) * hd)};
  for (int i = 0; i < w; ++i) {
    s.m[i] = 8.f * u(rng);
    if (kind == 1 && i % 2 == 1) s.m[i] = -INFINITY;   // warps that saw no token
    if (kind == 2) s.m[i] = -INFINITY;                 // a head with no token at all
    if (kind == 3 && i == 0) s.m[i] -= 200.f;          // a weight that underflows to 0
    s.l[i] = s.m[i] == -INFINITY ? 0.f : 1.f + 15.f * (u(rng) + 1.f);
    for (int c = 0; c < hd; ++c) s.acc[size_t(i) * hd + c] = s.m[i] == -INFINITY ? 0.f : 3.f * u(rng);
  }
  return s;
}

template <int W>
void check_width() {
  std::mt19937 rng(1234 + W);
  std::vector<int> forward(W), reversed(W);
  for (int i = 0; i < W; ++i) forward[i] = i, reversed[i] = W - 1 - i;
  int reversed_differs = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int kind = trial % 4;
    const WarpStates s = random_states(W, 256, rng, kind);
    std::vector<float> want, got, rev;
    float want_lse = 0.f, got_lse = 0.f, rev_lse = 0.f;
    per_output(s, forward, want, want_lse);
    merged<W>(s, got, got_lse);
    ASSERT_EQ(0, std::memcmp(&want_lse, &got_lse, sizeof got_lse)) << "W " << W << " trial " << trial;
    ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float))) << "W " << W << " trial " << trial;
    per_output(s, reversed, rev, rev_lse);
    reversed_differs += std::memcmp(want.data(), rev.data(), want.size() * sizeof(float)) != 0;
  }
  // The control: summing the warps in another order changes some bits, so
  // the comparison above can tell orders apart (it would fail on a reversed
  // merge).
  EXPECT_GT(reversed_differs, 0);
}

TEST(SplitTailHost, PerHeadWeightsGiveThePerOutputBits) {
  check_width<2>();  // head_dim 256
  check_width<4>();  // head_dim 64, 128
}

}  // namespace
}  // namespace activekv::cuda
