// The own-format error of a sliding-window layer is measured over its window,
// as the forward reads it: kernel and fp64 reference both see only keys in
// (p - W, p] (route_own_format_error with the layer's AttentionOptions).
#include <gtest/gtest.h>

#include <random>

#include "activekv/attention/quality.h"
#include "activekv/eval/own_format.h"

namespace activekv {
namespace {

constexpr int kPage = 32, kHeads = 4, kKvHeads = 2, kDim = 64, kTokens = 20 * kPage + 7;

TEST(OwnFormat, SlidingWindowIsMeasuredOverTheWindow) {
  kv::PageStore store(kv::KvShape{1, kKvHeads, kDim, kPage});
  kv::SequenceKv seq(store);
  std::mt19937 rng(3);
  std::normal_distribution<float> n01;
  std::vector<float> k(size_t(kTokens) * kKvHeads * kDim), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = n01(rng);
    v[i] = 0.3f + n01(rng);
  }
  seq.reserve(kTokens);
  seq.write(0, 0, kTokens, k.data(), v.data());
  seq.commit(kTokens);
  convert::CompressedHistory c(seq, {kv::CodecFormat::int8s}, 21, nullptr);
  c.schedule();

  std::vector<float> q(size_t(4) * kHeads * kDim);
  for (float& x : q) x = n01(rng);
  const std::vector<int64_t> pos{kTokens - 4, kTokens - 3, kTokens - 2, kTokens - 1};
  const attention::QueryRows rows{q.data(), 4, kHeads, pos.data()};
  const attention::LayerHistory h{&store, seq.page_table(0), kTokens};
  const route::RouteConfig cfg{route::RouteKind::int8s, 2, 4};
  attention::AttentionOptions windowed;
  windowed.window = 100;  // not a page multiple: the first visible page is read in part
  windowed.softmax_scale = 0.11f;

  const double err = eval::route_own_format_error(h, 0, c, cfg, rows, windowed);
  const double whole = eval::route_own_format_error(h, 0, c, cfg, rows, {});

  // The same figure computed by hand: the windowed kernel against the fp64
  // windowed reference over every page as the route reads it (int8s for the
  // full pages, the tail exact).
  route::RoutedView view{&c, cfg, nullptr, {}};
  attention::Workspace ws;
  const attention::Partial kernel = route::attend_routed(h, 0, view, rows, windowed, ws);
  attention::DenseHistoryF64 ref;
  for (size_t p = 0; p < 20; ++p) ref.append(c.published(0, p, kv::CodecFormat::int8s), kPage);
  ref.append(store, seq.page_table(0)[20], 7);
  const double by_hand = attention::own_format_error(kernel, attention::reference_attention(ref, rows, windowed));
  attention::AttentionOptions unwindowed_ref = windowed;
  unwindowed_ref.window = 0;
  const double wrong = attention::own_format_error(kernel, attention::reference_attention(ref, rows, unwindowed_ref));
  std::printf("[measured] own-format error, window 100: %.3e (by hand %.3e); whole history %.3e; windowed kernel "
              "vs unwindowed reference %.3e\n", err, by_hand, whole, wrong);
  EXPECT_EQ(err, by_hand);
  EXPECT_NE(err, whole);
  EXPECT_GT(err, 0.0);       // int8s pages were read
  EXPECT_LE(err, 0.005);     // and stay within the contract
  EXPECT_GT(wrong, 0.05);    // a reference over the whole history would not measure the kernel at all
}

}  // namespace
}  // namespace activekv
