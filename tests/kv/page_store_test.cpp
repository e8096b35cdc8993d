#include "activekv/kv/page_store.h"

#include <gtest/gtest.h>

#include <cmath>

namespace activekv {
namespace {

kv::KvShape shape(int page_size = 4, kv::PageFormat f = kv::PageFormat::bf16) {
  return {2, 2, 3, page_size, f};
}

// Value i of a plane, widened to fp32.
float at(kv::PageFormat f, const std::byte* plane, size_t i) {
  float out[8];
  kv::decode_elements(f, plane, i + 1, out);  // i < 8 in these tests
  return out[i];
}
float at(const std::byte* plane, size_t i) { return at(kv::PageFormat::bf16, plane, i); }

TEST(PageStore, RejectsBadShape) {
  EXPECT_THROW(kv::PageStore(kv::KvShape{0, 1, 1, 1}), InvalidArgument);
  EXPECT_THROW(kv::PageStore(kv::KvShape{1, 1, 1, 0}), InvalidArgument);
}

TEST(PageStore, AllocateReleaseReuse) {
  kv::PageStore s(shape(), 2);
  const kv::PageId a = s.allocate(), b = s.allocate();
  EXPECT_NE(a, b);
  EXPECT_THROW(s.allocate(), Error);  // pool full
  EXPECT_EQ(s.pages_in_use(), 2u);
  const float five = 5.0f;
  kv::encode_elements(kv::PageFormat::bf16, &five, 1, s.k_plane(a, 1), 0);
  EXPECT_EQ(at(s.k_plane(a, 1), 0), 5.0f);
  s.release(a);
  EXPECT_THROW(s.release(a), InvalidArgument);
  const kv::PageId c = s.allocate();
  EXPECT_EQ(c, a);
  EXPECT_EQ(at(s.k_plane(c, 1), 0), 0.0f);  // reused pages come back zeroed
}

class SequenceKvFormats : public ::testing::TestWithParam<kv::PageFormat> {};

TEST_P(SequenceKvFormats, WritesLandInHeadMajorPlanes) {
  const kv::PageFormat f = GetParam();
  kv::PageStore s(shape(4, f));
  kv::SequenceKv seq(s);
  const int n = 6;  // spans two pages
  std::vector<float> k(size_t(n) * 2 * 3), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = float(i);
    v[i] = -float(i);
  }
  seq.reserve(n);
  for (int l = 0; l < 2; ++l) seq.write(l, 0, n, k.data(), v.data());
  seq.commit(n);
  EXPECT_EQ(seq.n_tokens(), n);
  ASSERT_EQ(seq.page_table(1).size(), 2u);
  // token 5, head 1, dim 2 -> page 1, slot 1
  const kv::PageId p = seq.page_table(1)[1];
  EXPECT_EQ(at(f, s.k_plane(p, 1), 1 * 3 + 2), float(5 * 6 + 1 * 3 + 2));
  EXPECT_EQ(at(f, s.v_plane(p, 1), 1 * 3 + 2), -float(5 * 6 + 1 * 3 + 2));
}

INSTANTIATE_TEST_SUITE_P(Formats, SequenceKvFormats,
                         ::testing::Values(kv::PageFormat::bf16, kv::PageFormat::f32));

TEST(PageFormat, F32KeepsEveryBitAndBf16Rounds) {
  const float x = 1.0f + 0x1.0p-20f;
  std::byte plane[8];
  float back = 0;
  kv::encode_elements(kv::PageFormat::f32, &x, 1, plane, 1);
  kv::decode_elements(kv::PageFormat::f32, plane + 4, 1, &back);
  EXPECT_EQ(back, x);
  kv::encode_elements(kv::PageFormat::bf16, &x, 1, plane, 0);
  kv::decode_elements(kv::PageFormat::bf16, plane, 1, &back);
  EXPECT_EQ(back, 1.0f);
  EXPECT_EQ(kv::parse_page_format("f32"), kv::PageFormat::f32);
  EXPECT_THROW(kv::parse_page_format("int4"), InvalidArgument);
  EXPECT_EQ(shape(4, kv::PageFormat::f32).page_bytes(), 2 * shape(4).page_bytes());
}

TEST(SequenceKv, FullStoreLosesNothingAlreadyStored) {
  kv::PageStore s(shape(4), 4);  // two layers x two pages
  kv::SequenceKv seq(s);
  std::vector<float> k(8 * 6, 1.0f), v(8 * 6, 2.0f);
  seq.reserve(8);
  seq.write(0, 0, 8, k.data(), v.data());
  seq.write(1, 0, 8, k.data(), v.data());
  seq.commit(8);
  EXPECT_THROW(seq.reserve(1), Error);
  EXPECT_EQ(seq.n_tokens(), 8);
  EXPECT_EQ(seq.page_table(0).size(), 2u);
  EXPECT_EQ(s.pages_in_use(), 4u);
  EXPECT_EQ(at(s.v_plane(seq.page_table(1)[1], 0), 0), 2.0f);
}

TEST(SequenceKv, WriteOutsideReservedSpaceThrows) {
  kv::PageStore s(shape(4));
  kv::SequenceKv seq(s);
  std::vector<float> k(6 * 5);
  seq.reserve(3);
  EXPECT_THROW(seq.write(0, 2, 5, k.data(), k.data()), InvalidArgument);
  EXPECT_THROW(seq.write(2, 0, 1, k.data(), k.data()), InvalidArgument);
  EXPECT_THROW(seq.commit(5), InvalidArgument);
}

TEST(Bf16, RoundsToNearestEvenAndKeepsNan) {
  EXPECT_EQ(f32_to_bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3f808000u)).bits, 0x3f80);  // tie -> even
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3f818000u)).bits, 0x3f82);  // tie -> even (up)
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3f808001u)).bits, 0x3f81);
  const bf16 nan = f32_to_bf16(std::bit_cast<float>(0x7f800001u));
  EXPECT_TRUE(std::isnan(bf16_to_f32(nan)));
}

}  // namespace
}  // namespace activekv
