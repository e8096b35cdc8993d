// Paged attention against the fp64 reference; tiling and merge; repeatability.
#include "activekv/attention/paged_attention.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "activekv/attention/quality.h"

namespace activekv {
namespace {

using attention::AttentionOptions;
using attention::LayerHistory;
using attention::Partial;
using attention::QueryRows;

// A random layer history written into pages, plus its dense copy in double
// (what the pages hold: bf16-rounded values).
struct Fixture {
  kv::KvShape shape;
  kv::PageStore store;
  kv::SequenceKv seq;
  attention::DenseHistoryF64 dense;

  Fixture(int n_tokens, int page_size, int kv_heads, int head_dim, uint32_t seed)
      : shape{1, kv_heads, head_dim, page_size}, store(shape), seq(store) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    const size_t row = size_t(kv_heads) * head_dim;
    std::vector<float> k(size_t(n_tokens) * row), v(k.size());
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = n01(rng) * (1.0f + float(i % head_dim) / 8.0f);  // channels of different scale
      v[i] = n01(rng);
    }
    seq.reserve(n_tokens);
    seq.write(0, 0, n_tokens, k.data(), v.data());
    seq.commit(n_tokens);
    const auto table = seq.page_table(0);
    for (size_t p = 0; p < table.size(); ++p)
      dense.append(store, table[p], int(std::min<int64_t>(page_size, n_tokens - int64_t(p) * page_size)));
  }
  LayerHistory history() const { return {&store, seq.page_table(0), seq.n_tokens()}; }
};

std::vector<float> random_queries(int rows, int heads, int dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> q(size_t(rows) * heads * dim);
  for (float& x : q) x = n01(rng);
  return q;
}

// Max relative error of every row/head against the reference, and LSE error.
void expect_matches_reference(const Fixture& f, const std::vector<float>& q, const std::vector<int64_t>& pos,
                              int heads, const Partial& got, double tol) {
  for (size_t r = 0; r < pos.size(); ++r) {
    const attention::QueryRows row{q.data() + r * heads * f.shape.head_dim, 1, heads, &pos[r]};
    const attention::ReferencePartial ref = attention::reference_attention(f.dense, row, {});  // 1/sqrt(d)
    const std::vector<double>& o = ref.o;
    const std::vector<double>& lse = ref.lse;
    for (int h = 0; h < heads; ++h) {
      EXPECT_NEAR(got.lse_at(int(r), h), lse[size_t(h)], tol * std::abs(lse[size_t(h)]) + tol);
      for (int d = 0; d < f.shape.head_dim; ++d) {
        EXPECT_NEAR(got.o_at(int(r), h)[d], o[size_t(h) * f.shape.head_dim + d], tol)
            << "row " << r << " head " << h << " dim " << d;
      }
    }
  }
}

TEST(PagedAttention, DecodeRowMatchesFp64Reference) {
  Fixture f(3000, 256, 2, 64, 1);
  const int heads = 6;  // GQA group of 3
  auto q = random_queries(1, heads, 64, 2);
  std::vector<int64_t> pos{2999};
  attention::Workspace ws;
  const Partial got = attention::attend(f.history(), {q.data(), 1, heads, pos.data()}, {}, ws);
  expect_matches_reference(f, q, pos, heads, got, 2e-5);
}

TEST(PagedAttention, CausalPrefillRowsMatchReference) {
  Fixture f(700, 128, 3, 32, 3);
  const int heads = 9, rows = 20;
  auto q = random_queries(rows, heads, 32, 4);
  std::vector<int64_t> pos;
  for (int r = 0; r < rows; ++r) pos.push_back(680 + r);  // last 20 tokens, causal
  pos[0] = 0;                                             // a row that sees one key only
  pos[1] = 127;                                           // exactly a page boundary
  attention::Workspace ws;
  AttentionOptions opt;
  opt.tile_pages = 2;
  const Partial got = attention::attend(f.history(), {q.data(), rows, heads, pos.data()}, opt, ws);
  expect_matches_reference(f, q, pos, heads, got, 2e-5);
}

TEST(PagedAttention, OneTileAndManyTilesAgree) {
  Fixture f(4096 + 77, 64, 2, 64, 5);
  const int heads = 4;
  auto q = random_queries(3, heads, 64, 6);
  std::vector<int64_t> pos{4172, 4000, 100};
  attention::Workspace ws;
  AttentionOptions one, many;
  one.tile_pages = 1000;
  many.tile_pages = 8;  // 65 pages -> 9 tiles
  const QueryRows rows{q.data(), 3, heads, pos.data()};
  const Partial a = attention::attend(f.history(), rows, one, ws);
  const Partial b = attention::attend(f.history(), rows, many, ws);
  for (size_t i = 0; i < a.o.size(); ++i) EXPECT_NEAR(a.o[i], b.o[i], 1e-5);
  for (size_t i = 0; i < a.lse.size(); ++i) EXPECT_NEAR(a.lse[i], b.lse[i], 1e-5);
}

TEST(PagedAttention, WholeLayerRouteIsBitwiseTheUnsplitTile) {
  Fixture f(1500, 256, 2, 64, 7);
  auto q = random_queries(1, 4, 64, 8);
  std::vector<int64_t> pos{1499};
  attention::Workspace ws;
  const QueryRows rows{q.data(), 1, 4, pos.data()};
  const Partial routed = attention::attend(f.history(), rows, {}, ws);
  const Partial tile = attention::attend_tile(f.history(), 0, 6, rows, {}, ws);
  ASSERT_EQ(routed.o.size(), tile.o.size());
  EXPECT_EQ(0, std::memcmp(routed.o.data(), tile.o.data(), tile.o.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(routed.lse.data(), tile.lse.data(), tile.lse.size() * sizeof(float)));
}

TEST(PagedAttention, RepeatableBitwise) {
  Fixture f(5000, 128, 2, 64, 9);
  auto q = random_queries(4, 4, 64, 10);
  std::vector<int64_t> pos{4999, 4998, 2500, 17};
  AttentionOptions opt;
  opt.tile_pages = 4;
  const QueryRows rows{q.data(), 4, 4, pos.data()};
  attention::Workspace ws1, ws2;
  const Partial a = attention::attend(f.history(), rows, opt, ws1);
  const Partial b = attention::attend(f.history(), rows, opt, ws2);
  EXPECT_EQ(0, std::memcmp(a.o.data(), b.o.data(), a.o.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)));
}

TEST(PagedAttention, TileThatNoRowSeesIsEmpty) {
  Fixture f(600, 100, 1, 16, 11);
  auto q = random_queries(1, 2, 16, 12);
  std::vector<int64_t> pos{150};
  attention::Workspace ws;
  const Partial p = attention::attend_tile(f.history(), 3, 3, {q.data(), 1, 2, pos.data()}, {}, ws);
  EXPECT_TRUE(std::isinf(p.lse_at(0, 0)) && p.lse_at(0, 0) < 0);
  EXPECT_TRUE(std::isinf(p.lse_at(0, 1)) && p.lse_at(0, 1) < 0);
}

TEST(PagedAttention, BadShapesAreRejected) {
  Fixture f(100, 64, 2, 16, 13);
  auto q = random_queries(1, 3, 16, 14);
  std::vector<int64_t> pos{99}, beyond{100};
  attention::Workspace ws;
  EXPECT_THROW(attention::attend(f.history(), {q.data(), 1, 3, pos.data()}, {}, ws), InvalidArgument);
  EXPECT_THROW(attention::attend(f.history(), {q.data(), 1, 2, beyond.data()}, {}, ws), InvalidArgument);
  AttentionOptions bad;
  bad.tile_pages = 0;
  EXPECT_THROW(attention::attend(f.history(), {q.data(), 1, 2, pos.data()}, bad, ws), InvalidArgument);
}

}  // namespace
}  // namespace activekv
