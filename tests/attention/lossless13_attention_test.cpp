// lossless13 attention (over blobs or validated views) is bitwise identical
// to attend_tile over the bf16 pages.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "activekv/attention/attention_codecs.h"
#include "activekv/kv/codec_lossless13.h"

namespace activekv {
namespace {

using attention::Partial;

void expect_bitwise(const Partial& a, const Partial& b) {
  ASSERT_EQ(a.o.size(), b.o.size());
  ASSERT_EQ(std::memcmp(a.o.data(), b.o.data(), a.o.size() * sizeof(float)), 0);
  ASSERT_EQ(std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)), 0);
}

TEST(Lossless13Attention, BitwiseIdenticalToBf16Tiles) {
  const int n_tokens = 3000, P = 256, H = 2, d = 64, heads = 6;
  kv::KvShape shape{1, H, d, P};
  kv::PageStore store(shape);
  kv::SequenceKv seq(store);
  std::mt19937 rng(21);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> k(size_t(n_tokens) * H * d), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = n01(rng) * (1.0f + float(i % d) / 8.0f);
    v[i] = n01(rng);
  }
  // Page 3, head 1 keys span > 32 exponents: that plane takes the raw fallback.
  for (int t = 3 * P; t < 4 * P; ++t) k[(size_t(t) * H + 1) * d] = std::ldexp(1.0f, (t % 80) - 40);
  seq.reserve(n_tokens);
  seq.write(0, 0, n_tokens, k.data(), v.data());
  seq.commit(n_tokens);
  const auto table = seq.page_table(0);
  std::vector<kv::EncodedPage> enc;
  for (size_t p = 0; p < table.size(); ++p) {
    enc.push_back(kv::encode_page(kv::CodecFormat::lossless13, store, table[p], std::min(P, n_tokens - int(p) * P)));
  }
  EXPECT_EQ(kv::lossless13_plane_modes(enc[3])[1], kv::Lossless13Mode::raw);

  std::vector<int64_t> pos{2999, 2000, 1100, 1024, 700, 300, 5, 0};
  std::vector<float> q(pos.size() * heads * d);
  for (float& x : q) x = n01(rng);
  const attention::QueryRows rows{q.data(), int(pos.size()), heads, pos.data()};
  const attention::LayerHistory hist{&store, table, n_tokens};
  attention::AttentionOptions opt;
  attention::Workspace ws;
  for (auto [fp, np] : {std::pair<size_t, size_t>{0, 12}, {0, 4}, {4, 4}, {8, 4}, {11, 1}, {3, 2}}) {
    SCOPED_TRACE(::testing::Message() << "tile " << fp << "+" << np);
    std::vector<const kv::EncodedPage*> ptrs;
    for (size_t p = fp; p < fp + np; ++p) ptrs.push_back(&enc[p]);
    const Partial want = attention::attend_tile(hist, fp, np, rows, opt, ws);
    const Partial got = attention::attend_lossless13_tile(ptrs, int64_t(fp) * P, n_tokens, rows, opt);
    expect_bitwise(got, want);
    // Over views validated beforehand (as published pages are): same bits.
    std::vector<kv::Lossless13PageView> views;
    for (const kv::EncodedPage* e : ptrs) views.push_back(kv::parse_lossless13_page(e->bytes));
    expect_bitwise(attention::attend_lossless13_tile(std::span<const kv::Lossless13PageView>(views), int64_t(fp) * P,
                                                     n_tokens, rows, opt, ws),
                   want);
  }
  // The merged whole history (tiles of 4 pages) matches attend() bitwise too.
  opt.tile_pages = 4;
  std::vector<Partial> parts;
  for (size_t fp = 0; fp < 12; fp += 4) {
    std::vector<const kv::EncodedPage*> ptrs{&enc[fp], &enc[fp + 1], &enc[fp + 2], &enc[fp + 3]};
    parts.push_back(attention::attend_lossless13_tile(ptrs, int64_t(fp) * P, n_tokens, rows, opt, ws));
  }
  expect_bitwise(attention::merge(parts), attention::attend(hist, rows, opt, ws));
}

}  // namespace
}  // namespace activekv
