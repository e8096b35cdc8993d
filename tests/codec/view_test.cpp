// Validated page views: what the CPU kernels read after the one validation
// at publication. The 13-bit unpacker (portable and AVX2) against a bit-by-bit
// reading of the stream; views over a span against the blob decoders.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "../../src/codec/unpack13.h"
#include "activekv/core/error.h"
#include "activekv/kv/codec.h"
#include "activekv/kv/codec_int8s.h"
#include "activekv/kv/codec_lossless13.h"
#include "codec_test_util.h"

namespace activekv {
namespace {

// A random plane of n codes with table indexes < n_exp, packed LSB-first
// into exactly ceil(13 n / 8) bytes, and the bf16 patterns it encodes.
struct Stream {
  std::vector<uint8_t> bytes, table;
  std::vector<uint16_t> want;
};

Stream random_stream(size_t n, int n_exp, uint32_t seed) {
  std::mt19937 rng(seed);
  Stream s;
  s.table.assign(32, 0);
  for (int i = 0; i < n_exp; ++i) s.table[size_t(i)] = uint8_t(rng());  // any values: the unpacker only looks up
  s.bytes.assign((13 * n + 7) / 8, 0);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t sign = rng() & 1u, index = rng() % uint32_t(n_exp), mant = rng() & 0x7fu;
    const uint32_t code = sign << 12 | index << 7 | mant;
    for (int b = 0; b < 13; ++b) {
      if (code >> b & 1u) s.bytes[(13 * i + size_t(b)) / 8] |= uint8_t(1u << ((13 * i + size_t(b)) % 8));
    }
    s.want.push_back(uint16_t(sign << 15 | uint32_t(s.table[index]) << 7 | mant));
  }
  return s;
}

void expect_unpacks(const Stream& s, bool avx2) {
  const size_t n = s.want.size();
  std::vector<uint16_t> b(n + 1, 0xdead);
  std::vector<float> f(n + 1, -1.0f);
  if (avx2) {
    kv::detail::unpack13_avx2(s.bytes.data(), n, s.table.data(), b.data());
    kv::detail::unpack13_avx2(s.bytes.data(), n, s.table.data(), f.data());
  } else {
    kv::detail::unpack13_portable(s.bytes.data(), n, s.table.data(), b.data());
    kv::detail::unpack13_portable(s.bytes.data(), n, s.table.data(), f.data());
  }
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(b[i], s.want[i]) << "value " << i << " of " << n;
    ASSERT_EQ(std::bit_cast<uint32_t>(f[i]), uint32_t(s.want[i]) << 16) << "value " << i << " of " << n;
  }
  EXPECT_EQ(b[n], 0xdead) << "wrote past " << n;
  EXPECT_EQ(f[n], -1.0f) << "wrote past " << n;
}

TEST(Unpack13, PortableAndAvx2ReadTheStreamBitForBit) {
  // Every length up to 70 covers each remainder mod 8 and the AVX2 loop's
  // exit (it stops 3 bytes short of the stream's end); then long planes.
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 70; ++n) lengths.push_back(n);
  for (size_t n : {4096, 4099, 65536, 65541}) lengths.push_back(n);
  for (size_t n : lengths) {
    for (int n_exp : {1, 16, 17, 32}) {
      const Stream s = random_stream(n, n_exp, uint32_t(n * 33 + size_t(n_exp)));
      expect_unpacks(s, false);
      if (kv::detail::have_avx2()) expect_unpacks(s, true);
    }
  }
  if (!kv::detail::have_avx2()) GTEST_SKIP() << "no AVX2 on this CPU: only the portable unpacker was checked";
}

// The validation's index scan finds the first out-of-table index wherever it
// lies: inside a group of 8, at a group's end, or in the tail.
TEST(Unpack13, FirstIndexAtLeastFindsTheFirstBadCode) {
  for (size_t n : {1, 7, 8, 9, 29, 64, 1001}) {
    Stream s = random_stream(n, 20, uint32_t(n));
    EXPECT_EQ(kv::detail::first_index_at_least(s.bytes.data(), n, 20), n);
    EXPECT_EQ(kv::detail::first_index_at_least(s.bytes.data(), n, 32), n);
    for (size_t bad : {size_t(0), n / 2, n - 1, n > 8 ? size_t(7) : size_t(0), n > 16 ? size_t(8) : n - 1}) {
      Stream c = s;
      for (size_t b = 7; b < 12; ++b) {  // index bits 7..11 of code `bad` := 31
        c.bytes[(13 * bad + b) / 8] |= uint8_t(1u << ((13 * bad + b) % 8));
      }
      EXPECT_EQ(kv::detail::first_index_at_least(c.bytes.data(), n, 20), bad) << "n " << n;
      EXPECT_EQ(kv::detail::first_index_at_least(c.bytes.data(), n, 32), n);
    }
  }
}

TEST(Lossless13View, DecodePlaneMatchesPageDecodeForPartialPlanes) {
  const auto sh = testing::codec_shape(64, 2, 24);
  std::vector<bf16> page = testing::random_page(sh, 3);
  for (uint32_t i = 0; i < 1024; ++i) page[testing::at(sh, 3, 0, 0) + i].bits = uint16_t(i * 64);  // V1 raw
  for (int n_tokens : {64, 37, 1}) {
    const kv::EncodedPage enc = kv::encode_lossless13_page(sh, page, n_tokens);
    const kv::Lossless13PageView view = kv::parse_lossless13_page(std::span<const std::byte>(enc.bytes));
    ASSERT_EQ(view.n_planes(), 4);
    EXPECT_EQ(view.mode(0), kv::Lossless13Mode::table);
    if (n_tokens == 64) EXPECT_EQ(view.mode(3), kv::Lossless13Mode::raw);
    std::vector<bf16> whole(sh.page_elements());
    kv::decode_lossless13_page(enc, whole);
    // Whole tokens, and a count that is neither whole tokens nor whole groups of 8.
    for (size_t n : {size_t(n_tokens) * 24, size_t(n_tokens) * 24 - 5}) {
      for (int p = 0; p < 4; ++p) {
        std::vector<bf16> b(n);
        std::vector<float> f(n);
        view.decode_plane(p, n, b.data());
        view.decode_plane(p, n, f.data());
        for (size_t i = 0; i < n; ++i) {
          const bf16 want = whole[size_t(p) * sh.plane_elements() + i];
          ASSERT_EQ(b[i].bits, want.bits) << "plane " << p << " value " << i;
          ASSERT_EQ(std::bit_cast<uint32_t>(f[i]), std::bit_cast<uint32_t>(bf16_to_f32(want))) << p << " " << i;
        }
      }
    }
  }
}

TEST(Int8sView, SectionsFollowTheLayoutAndScalesWidenExactly) {
  const auto sh = testing::codec_shape(16, 2, 8);
  const kv::EncodedPage enc = kv::encode_int8s_page(sh, testing::random_page(sh, 5), 13);
  const kv::Int8sPageView view = kv::parse_int8s_page(std::span<const std::byte>(enc.bytes));
  EXPECT_EQ(view.blob.data(), enc.bytes.data());
  EXPECT_EQ(view.header.n_tokens, 13);
  // Head 0 (d = 8, n = 13): c at 64, s at 80, kq at 106, v at 210, vq at 226; head 1 at 330.
  const std::byte* base = enc.bytes.data();
  const kv::Int8sHeadView h0 = view.head(0), h1 = view.head(1);
  EXPECT_EQ(h0.c_fp16 - base, 64);
  EXPECT_EQ(h0.s_fp16 - base, 80);
  EXPECT_EQ(reinterpret_cast<const std::byte*>(h0.kq) - base, 106);
  EXPECT_EQ(h0.v_fp16 - base, 210);
  EXPECT_EQ(reinterpret_cast<const std::byte*>(h0.vq) - base, 226);
  EXPECT_EQ(h1.c_fp16 - base, 330);
  std::vector<float> c(8), s(13);
  kv::fp16_to_f32(h1.c_fp16, 8, c.data());
  kv::fp16_to_f32(h1.s_fp16, 13, s.data());
  for (size_t j = 0; j < 8; ++j) EXPECT_EQ(c[j], h1.c(j));
  for (size_t t = 0; t < 13; ++t) EXPECT_EQ(s[t], h1.s(t));
  // The dequantised values decode_page_f32 gives are the view's c * s * code.
  std::vector<float> deq(sh.page_elements());
  kv::decode_page_f32(enc, deq);
  const size_t at = sh.plane_elements() + 5 * 8 + 3;  // K plane of head 1, token 5, channel 3
  EXPECT_EQ(deq[at], float(double(h1.c(3)) * double(h1.s(5)) * double(h1.kq[5 * 8 + 3])));
}

TEST(ValidatePage, ChecksEverythingTheFormatParsersCheck) {
  const auto sh = testing::codec_shape(16, 2, 8);
  for (kv::CodecFormat f : {kv::CodecFormat::int8s, kv::CodecFormat::lossless13}) {
    const kv::EncodedPage enc = kv::encode_page(f, sh, testing::random_page(sh, 9), 13);
    EXPECT_EQ(kv::validate_page(enc.bytes).format, f);
    kv::EncodedPage stale = enc;
    stale.bytes.back() ^= std::byte{1};
    EXPECT_THROW(kv::validate_page(stale.bytes), Error) << kv::codec_name(f) << ": checksum";
  }
  // Metadata behind a valid checksum: an int8s key code of -128.
  kv::EncodedPage bad = kv::encode_page(kv::CodecFormat::int8s, sh, testing::random_page(sh, 9), 13);
  bad.bytes[106] = std::byte(0x80);
  kv::rewrite_checksum(bad);
  EXPECT_THROW(kv::validate_page(bad.bytes), Error);
  EXPECT_THROW(kv::validate_page(std::span<const std::byte>(bad.bytes).first(40)), Error);
}

}  // namespace
}  // namespace activekv
