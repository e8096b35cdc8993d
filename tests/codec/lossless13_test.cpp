// lossless13: bit-exact round trips for every bf16 pattern, table vs raw path.
#include "activekv/kv/codec_lossless13.h"

#include <gtest/gtest.h>

#include <set>

#include "codec_test_util.h"

namespace activekv {
namespace {

using kv::Lossless13Mode;

void expect_round_trip(const kv::KvShape& s, const std::vector<bf16>& page, int n_tokens) {
  const kv::EncodedPage enc = kv::encode_lossless13_page(s, page, n_tokens);
  std::vector<bf16> out(s.page_elements(), bf16{0x1234});
  kv::decode_lossless13_page(enc, out);
  const size_t n = size_t(n_tokens) * s.head_dim;
  for (int p = 0; p < 2 * s.n_kv_heads; ++p) {
    for (size_t i = 0; i < s.plane_elements(); ++i) {
      const size_t k = size_t(p) * s.plane_elements() + i;
      const uint16_t want = i < n ? page[k].bits : 0;
      ASSERT_EQ(out[k].bits, want) << "plane " << p << " element " << i;
    }
  }
}

TEST(Lossless13, AllPatternsInOnePlaneTakeRawPathAndRoundTrip) {
  const auto s = testing::codec_shape(256, 1, 256);  // plane = 65536 values
  std::vector<bf16> page = testing::random_page(s, 1);
  for (uint32_t i = 0; i < 65536; ++i) page[i].bits = uint16_t(i);  // K plane: every pattern
  const kv::EncodedPage enc = kv::encode_lossless13_page(s, page, 256);
  EXPECT_EQ(kv::lossless13_plane_modes(enc), (std::vector<Lossless13Mode>{Lossless13Mode::raw, Lossless13Mode::table}));
  expect_round_trip(s, page, 256);
}

TEST(Lossless13, EveryPatternRoundTripsThroughTablePath) {
  // 8 planes of 32 exponents each cover all 256 exponents x 2 signs x 128 mantissas.
  const auto s = testing::codec_shape(128, 4, 64);  // plane = 8192 = 32 * 256
  std::vector<bf16> page(s.page_elements());
  for (int p = 0; p < 8; ++p) {
    size_t i = 0;
    for (uint32_t e = uint32_t(p) * 32; e < uint32_t(p + 1) * 32; ++e) {
      for (uint32_t sm = 0; sm < 256; ++sm) {
        const uint32_t sign = sm >> 7, mant = sm & 0x7f;
        page[size_t(p) * s.plane_elements() + i++].bits = uint16_t((sign << 15) | (e << 7) | mant);
      }
    }
  }
  const kv::EncodedPage enc = kv::encode_lossless13_page(s, page, 128);
  for (Lossless13Mode m : kv::lossless13_plane_modes(enc)) EXPECT_EQ(m, Lossless13Mode::table);
  expect_round_trip(s, page, 128);
}

TEST(Lossless13, SpecialsWithFewExponentsUseTable) {
  const auto s = testing::codec_shape(64, 1, 64);
  std::vector<bf16> page = testing::random_page(s, 2);
  // K plane: +-0, all subnormals, +-inf, NaN payloads (both signs), normals.
  size_t i = 0;
  for (uint32_t m = 0; m < 128; ++m) {
    page[i++].bits = uint16_t(m);           // +0 and subnormals
    page[i++].bits = uint16_t(0x8000 | m);  // -0 and negative subnormals
    page[i++].bits = uint16_t(0x7f80 | m);  // +inf and NaN payloads
    page[i++].bits = uint16_t(0xff80 | m);  // -inf and negative NaNs
  }
  for (; i < s.plane_elements(); ++i) page[i].bits = uint16_t((uint32_t(100 + i % 30) << 7) | (i & 0x7f));
  std::set<int> exps;
  for (size_t k = 0; k < s.plane_elements(); ++k) exps.insert((page[k].bits >> 7) & 0xff);
  ASSERT_EQ(exps.size(), 32u);  // exactly the table limit
  const kv::EncodedPage enc = kv::encode_lossless13_page(s, page, 64);
  EXPECT_EQ(kv::lossless13_plane_modes(enc)[0], Lossless13Mode::table);
  expect_round_trip(s, page, 64);
  // A 33rd exponent forces the raw fallback for that plane only.
  page[s.plane_elements() - 1].bits = uint16_t(uint32_t(200) << 7);
  const kv::EncodedPage raw = kv::encode_lossless13_page(s, page, 64);
  EXPECT_EQ(kv::lossless13_plane_modes(raw)[0], Lossless13Mode::raw);
  EXPECT_EQ(kv::lossless13_plane_modes(raw)[1], Lossless13Mode::table);
  expect_round_trip(s, page, 64);
}

TEST(Lossless13, PartialPagesAndOddSizesRoundTrip) {
  for (int n_tokens : {1, 3, 7, 100, 128}) {
    const auto s = testing::codec_shape(128, 2, 24);  // 13 * n not a multiple of 8 for odd n
    expect_round_trip(s, testing::random_page(s, uint32_t(n_tokens)), n_tokens);
  }
}

TEST(Lossless13, RealisticPageIsTableSizedAndDecodesToF32Exactly) {
  const auto s = testing::codec_shape(1024, 2, 128);
  const auto page = testing::random_page(s, 3);
  const kv::EncodedPage enc = kv::encode_lossless13_page(s, page, 1024);
  for (Lossless13Mode m : kv::lossless13_plane_modes(enc)) EXPECT_EQ(m, Lossless13Mode::table);
  EXPECT_LE(enc.bytes.size(), kv::encoded_page_bytes(kv::CodecFormat::lossless13, s));
  EXPECT_LT(enc.bytes.size(), kv::lossless13_raw_page_bytes(s));
  std::vector<float> f(s.page_elements());
  kv::decode_page_f32(enc, f);
  for (size_t i = 0; i < f.size(); ++i) ASSERT_EQ(std::bit_cast<uint32_t>(f[i]), uint32_t(page[i].bits) << 16);
}

TEST(Lossless13, BytesPerToken) {
  kv::KvShape s = testing::codec_shape(1024, 4, 256);  // the 27B attention shape
  const double bf16_bytes = double(s.bytes_per_token_per_layer());
  const double l13 = kv::bytes_per_token(kv::CodecFormat::lossless13, s);
  const double i8 = kv::bytes_per_token(kv::CodecFormat::int8s, s);
  std::printf("27B shape (4 KV heads x 256, page 1024), bytes/token/layer: bf16 %.2f  lossless13 %.2f (%.4f)  "
              "int8s %.2f (%.4f)\n", bf16_bytes, l13, l13 / bf16_bytes, i8, i8 / bf16_bytes);
  EXPECT_NEAR(l13 / bf16_bytes, 13.0 / 16.0, 0.001);
  EXPECT_NEAR(i8 / bf16_bytes, 0.51, 0.01);
  // int8s exactly: per head 2 x 256 codes + 2 B token scale per token, 2 x 256 x 2 B channel scales per page.
  EXPECT_DOUBLE_EQ(i8, (64.0 + 4 * (1024.0 * (2 * 256 + 2) + 2 * 256 * 2)) / 1024.0);
}

}  // namespace
}  // namespace activekv
