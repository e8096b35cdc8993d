// Malformed blobs: every header field, truncation, checksum, format metadata.
// Each must raise activekv::Error naming the problem, never crash (run under ASan).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <string>

#include "activekv/core/error.h"
#include "activekv/kv/codec.h"
#include "activekv/kv/codec_int8s.h"
#include "activekv/kv/codec_lossless13.h"
#include "codec_test_util.h"

namespace activekv {
namespace {

using kv::CodecFormat;
using kv::EncodedPage;

const kv::KvShape kShape = testing::codec_shape(16, 2, 8);

EncodedPage sample(CodecFormat f) {
  return kv::encode_page(f, kShape, testing::random_page(kShape, 9), 13);
}

// Decodes through the generic entry point and the format's own parser.
void decode_all(const EncodedPage& p) {
  std::vector<float> out(kShape.page_elements() * 64);
  kv::decode_page_f32(p, out);
}

// Expects decode to throw Error whose message contains `needle`.
void expect_error(const EncodedPage& p, const std::string& needle) {
  try {
    decode_all(p);
    ADD_FAILURE() << "no error; expected '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what() << "  (expected '" << needle << "')";
  }
}

template <class T>
EncodedPage with_field(EncodedPage p, size_t off, T value, bool reseal) {
  std::memcpy(p.bytes.data() + off, &value, sizeof(T));
  if (reseal) kv::rewrite_checksum(p);
  return p;
}

class HeaderTest : public ::testing::TestWithParam<CodecFormat> {};

TEST_P(HeaderTest, ValidBlobDecodes) { EXPECT_NO_THROW(decode_all(sample(GetParam()))); }

TEST_P(HeaderTest, EveryHeaderFieldIsChecked) {
  const EncodedPage p = sample(GetParam());
  const CodecFormat other = GetParam() == CodecFormat::int8s ? CodecFormat::lossless13 : CodecFormat::int8s;
  for (bool reseal : {false, true}) {
    SCOPED_TRACE(reseal ? "checksum rewritten" : "checksum stale");
    expect_error(with_field<uint32_t>(p, 0, 0x12345678u, reseal), "magic");
    expect_error(with_field<uint16_t>(p, 4, 7, reseal), "format id 7");
    expect_error(with_field<uint16_t>(p, 6, 2, reseal), "version 2");
    expect_error(with_field<uint32_t>(p, 8, 0, reseal), "page_size 0");
    expect_error(with_field<uint32_t>(p, 8, (1u << 20) + 1, reseal), "page_size");
    expect_error(with_field<uint32_t>(p, 8, 12, reseal), "n_tokens 13 outside");  // page_size < n_tokens
    expect_error(with_field<uint32_t>(p, 12, 0, reseal), "n_kv_heads 0");
    expect_error(with_field<uint32_t>(p, 12, 5000, reseal), "n_kv_heads 5000");
    expect_error(with_field<uint32_t>(p, 16, 0, reseal), "head_dim 0");
    expect_error(with_field<uint32_t>(p, 16, 4096, reseal), "head_dim 4096");
    expect_error(with_field<uint32_t>(p, 20, 0, reseal), "n_tokens 0");
    expect_error(with_field<uint32_t>(p, 20, 17, reseal), "n_tokens 17");
    expect_error(with_field<uint64_t>(p, 24, 5, reseal), "payload bytes");
    expect_error(with_field<uint64_t>(p, 24, ~0ull, reseal), "payload bytes");
    expect_error(with_field<uint8_t>(p, 50, 1, reseal), "reserved");
  }
  // Fields changed to other *valid* values: caught by the checksum, or (resealed)
  // by the payload size the new dimensions imply.
  expect_error(with_field<uint32_t>(p, 8, 15, false), "checksum");
  expect_error(with_field<uint32_t>(p, 12, 1, false), "checksum");
  expect_error(with_field<uint32_t>(p, 16, 4, false), "checksum");
  expect_error(with_field<uint32_t>(p, 20, 12, false), "checksum");
  expect_error(with_field<uint64_t>(p, 32, 1, false), "checksum");
  expect_error(with_field<uint16_t>(p, 4, uint16_t(other), false), "checksum");
  if (GetParam() == CodecFormat::int8s) {
    expect_error(with_field<uint32_t>(p, 12, 1, true), "payload is");
    expect_error(with_field<uint32_t>(p, 16, 4, true), "payload is");
    expect_error(with_field<uint32_t>(p, 20, 12, true), "payload is");
  } else {
    expect_error(with_field<uint32_t>(p, 12, 1, true), "lossless13 page");
    expect_error(with_field<uint32_t>(p, 16, 4, true), "lossless13 page");
    expect_error(with_field<uint32_t>(p, 20, 12, true), "lossless13 page");
  }
  expect_error(with_field<uint16_t>(p, 4, uint16_t(other), true), "page");
}

TEST_P(HeaderTest, TruncatedBlobsAreRejected) {
  const EncodedPage p = sample(GetParam());
  for (size_t n = 0; n < p.bytes.size(); ++n) {
    EncodedPage t{std::vector<std::byte>(p.bytes.begin(), p.bytes.begin() + ptrdiff_t(n))};
    EXPECT_THROW(decode_all(t), Error) << n;
  }
  EncodedPage longer = p;
  longer.bytes.push_back(std::byte{0});
  expect_error(longer, "payload bytes");
}

TEST_P(HeaderTest, AnyFlippedPayloadBitFailsTheChecksum) {
  const EncodedPage p = sample(GetParam());
  for (size_t i = kv::kCodecHeaderBytes; i < p.bytes.size(); ++i) {
    EncodedPage c = p;
    c.bytes[i] ^= std::byte{0x10};
    expect_error(c, "checksum mismatch");
  }
}

TEST_P(HeaderTest, RandomResealedCorruptionNeverCrashes) {
  const EncodedPage p = sample(GetParam());
  std::mt19937 rng(13);
  int rejected = 0;
  for (int it = 0; it < 3000; ++it) {
    EncodedPage c = p;
    const int flips = 1 + int(rng() % 4);
    for (int f = 0; f < flips; ++f) c.bytes[rng() % c.bytes.size()] ^= std::byte(1u << (rng() % 8));
    kv::rewrite_checksum(c);
    try {
      decode_all(c);
    } catch (const Error&) {
      ++rejected;
    }
  }
  std::printf("%s: %d of 3000 resealed corruptions rejected, the rest decode to valid pages\n",
              kv::codec_name(GetParam()).c_str(), rejected);
}

INSTANTIATE_TEST_SUITE_P(Formats, HeaderTest, ::testing::Values(CodecFormat::lossless13, CodecFormat::int8s),
                         [](const auto& info) { return kv::codec_name(info.param); });

// int8s metadata. Head 0 layout (d = 8, n = 13): c at 64, s at 80, kq at 106,
// v at 210, vq at 226.
constexpr size_t kC = 64, kS = 80, kKq = 106, kV = 210, kVq = 226;

TEST(Int8sValidation, ScalesAndCodesAreChecked) {
  const EncodedPage p = sample(CodecFormat::int8s);
  ASSERT_EQ(p.bytes.size(), kv::kCodecHeaderBytes + kv::int8s_payload_bytes(2, 8, 13));
  expect_error(with_field<uint16_t>(p, kC + 2, 0x7e00, true), "key channel scale 1 of head 0 is not finite");
  expect_error(with_field<uint16_t>(p, kC, 0x7c00, true), "key channel scale 0 of head 0 is not finite");
  expect_error(with_field<uint16_t>(p, kC, 0x0000, true), "outside [2^-14, 2^14]");
  expect_error(with_field<uint16_t>(p, kC, 0x0200, true), "outside [2^-14, 2^14]");  // 2^-15 subnormal
  expect_error(with_field<uint16_t>(p, kC, 0x7800, true), "outside [2^-14, 2^14]");  // 2^15
  expect_error(with_field<uint16_t>(p, kC, 0xbc00, true), "outside [2^-14, 2^14]");  // -1
  expect_error(with_field<uint16_t>(p, kS + 4, 0xfc01, true), "key token scale 2 of head 0 is not finite");
  expect_error(with_field<uint16_t>(p, kS, 0x7c00, true), "key token scale 0 of head 0 is not finite");
  expect_error(with_field<uint16_t>(p, kS, 0xbc00, true), "key token scale 0 of head 0 is negative");
  expect_error(with_field<uint16_t>(p, kS, 0x8000, true), "negative");  // -0
  expect_error(with_field<uint16_t>(p, kV, 0x7e00, true), "value channel scale 0 of head 0 is not finite");
  expect_error(with_field<uint16_t>(p, kV + 14, 0xc000, true), "value channel scale 7 of head 0 is negative");
  expect_error(with_field<int8_t>(p, kKq + 5, -128, true), "key code 5 of head 0 is -128");
  expect_error(with_field<int8_t>(p, kVq, -128, true), "value code 0 of head 0 is -128");
  const size_t head1 = kv::kCodecHeaderBytes + kv::int8s_payload_bytes(1, 8, 13);
  expect_error(with_field<uint16_t>(p, head1, 0x7e00, true), "key channel scale 0 of head 1");
  // Zero token and value scales are legal (all-zero token / channel).
  EXPECT_NO_THROW(decode_all(with_field<uint16_t>(p, kS, 0x0000, true)));
  EXPECT_NO_THROW(decode_all(with_field<uint16_t>(p, kV, 0x0000, true)));
}

TEST(Lossless13Validation, TableDirectoryAndPaddingAreChecked) {
  const EncodedPage p = sample(CodecFormat::lossless13);
  // Directory: 4 planes x u32 at 64; plane 0 at payload offset 16 (byte 80).
  constexpr size_t kPlane0 = kv::kCodecHeaderBytes + 16;
  const uint8_t n_exp = uint8_t(p.bytes[kPlane0 + 1]);
  ASSERT_EQ(uint8_t(p.bytes[kPlane0]), 0);  // table mode
  ASSERT_GE(n_exp, 2);
  expect_error(with_field<uint32_t>(p, 64, 17, true), "plane 0 offset 17");
  expect_error(with_field<uint32_t>(p, 68, 0, true), "plane 1 offset 0");
  expect_error(with_field<uint8_t>(p, kPlane0, 2, true), "plane 0 has unknown mode 2");
  expect_error(with_field<uint8_t>(p, kPlane0 + 1, 0, true), "table size 0");
  expect_error(with_field<uint8_t>(p, kPlane0 + 1, 33, true), "table size 33");
  expect_error(with_field<uint8_t>(p, kPlane0 + 2, uint8_t(p.bytes[kPlane0 + 3]), true), "not strictly ascending");
  // Table shrunk by one entry (payload shifted): out-of-range or size errors, never a read past the end.
  expect_error(with_field<uint8_t>(p, kPlane0 + 1, uint8_t(n_exp - 1), true), "lossless13 page");
  // First code: index bits 7..11 of the first 13-bit code -> 31 (>= n_exp).
  {
    EncodedPage c = p;
    const size_t data = kPlane0 + 2 + n_exp;
    uint16_t w;
    std::memcpy(&w, c.bytes.data() + data, 2);
    w = uint16_t(w | (0x1fu << 7));
    std::memcpy(c.bytes.data() + data, &w, 2);
    kv::rewrite_checksum(c);
    expect_error(c, "plane 0 value 0 has table index 31");
  }
  // 13 * 13 * 8 = 1352 bits = 169 bytes exactly: no padding in a 13-token plane
  // of 8 channels, so test padding with a 3-token page.
  {
    const EncodedPage q = kv::encode_page(CodecFormat::lossless13, kShape, testing::random_page(kShape, 9), 3);
    // 24 values -> 312 bits = 39 bytes: no padding either; use 1 token -> 8 values -> 104 bits = 13 bytes.
    const EncodedPage r = kv::encode_page(CodecFormat::lossless13, testing::codec_shape(16, 1, 3),
                                          testing::random_page(testing::codec_shape(16, 1, 3), 9), 1);
    // 3 values -> 39 bits -> 5 bytes, 1 padding bit (the top bit of the last byte).
    const size_t plane0 = kv::kCodecHeaderBytes + 8;
    const size_t last = plane0 + 2 + uint8_t(r.bytes[plane0 + 1]) + 4;
    EncodedPage c = r;
    c.bytes[last] |= std::byte{0x80};
    kv::rewrite_checksum(c);
    try {
      std::vector<bf16> out(1024);
      kv::decode_lossless13_page(c, out);
      ADD_FAILURE() << "padding bits accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("padding"), std::string::npos) << e.what();
    }
    (void)q;
  }
  // Raw plane with a non-zero table size.
  {
    std::vector<bf16> page = testing::random_page(kShape, 9);
    for (uint32_t i = 0; i < 128; ++i) page[i].bits = uint16_t(i << 7);  // 128 exponents -> raw
    const EncodedPage r = kv::encode_page(CodecFormat::lossless13, kShape, page, 16);
    ASSERT_EQ(kv::lossless13_plane_modes(r)[0], kv::Lossless13Mode::raw);
    expect_error(with_field<uint8_t>(r, kPlane0 + 1, 3, true), "raw plane 0 has table size 3");
  }
}

TEST(CodecApi, NamesAndEncodeArguments) {
  EXPECT_EQ(kv::parse_codec_format("int8s"), CodecFormat::int8s);
  EXPECT_EQ(kv::parse_codec_format("lossless13"), CodecFormat::lossless13);
  EXPECT_THROW(kv::parse_codec_format("int4"), InvalidArgument);
  std::vector<bf16> small(10);
  EXPECT_THROW(kv::encode_page(CodecFormat::int8s, kShape, small, 4), InvalidArgument);
  EXPECT_THROW(kv::encode_page(CodecFormat::lossless13, kShape, small, 4), InvalidArgument);
  EncodedPage empty;
  EXPECT_THROW(kv::rewrite_checksum(empty), Error);
  // A PageStore page encodes the same as its span.
  kv::PageStore store(kShape);
  const kv::PageId id = store.allocate();
  const auto page = testing::random_page(kShape, 9);
  std::memcpy(store.k_plane(id, 0), page.data(), page.size() * 2);
  EXPECT_EQ(kv::encode_page(CodecFormat::int8s, store, id, 13).bytes, sample(CodecFormat::int8s).bytes);
}

}  // namespace
}  // namespace activekv
