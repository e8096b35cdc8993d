// Dequantisation of every supported type against gguf-py's independent numpy
// dequantiser (expected values in tests/fixtures/gguf/types.expected.bin, see
// tools/make_gguf_fixtures.py for the format).
//
// The comparison is BITWISE: our loops use the same float32 operations in the
// same order as ggml/gguf-py (e.g. Q4_K = (d*sc)*q - (dmin*m)) and the build
// does not contract them into FMAs (-std=c++20 implies -ffp-contract=off on
// GCC; x86-64 baseline has no FMA), so no ulp tolerance is needed. NaNs are
// compared by bit pattern too (payloads must survive f16 -> f32).
#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>

#include "gguf_test_util.h"

namespace activekv::gguf {
namespace {

using testing::fixture_path;

std::map<std::string, std::vector<float>> load_expected() {
  const auto b = testing::read_bytes(fixture_path("types.expected.bin"));
  size_t pos = 0;
  auto take = [&](void* dst, size_t n) {
    if (pos + n > b.size()) throw std::runtime_error("types.expected.bin truncated");
    std::memcpy(dst, b.data() + pos, n);
    pos += n;
  };
  uint32_t magic = 0, count = 0;
  take(&magic, 4);
  take(&count, 4);
  if (magic != 0x58564b41) throw std::runtime_error("types.expected.bin: bad magic");
  std::map<std::string, std::vector<float>> out;
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t name_len = 0;
    take(&name_len, 4);
    std::string name(name_len, '\0');
    take(name.data(), name_len);
    uint64_t n = 0;
    take(&n, 8);
    std::vector<float> v(n);
    take(v.data(), n * 4);
    out.emplace(std::move(name), std::move(v));
  }
  return out;
}

TEST(Dequant, AllTypesMatchGgufPyBitwise) {
  const File file = File::open(fixture_path("types.gguf"));
  const auto expected = load_expected();
  ASSERT_EQ(expected.size(), 9u);
  for (const auto& [name, want] : expected) {
    SCOPED_TRACE(name);
    const TensorInfo& t = file.tensor(name);
    ASSERT_EQ(t.n_elements, want.size());
    std::vector<float> got(t.n_elements);
    dequantize(t.type, t.data, got.data(), t.n_elements);
    size_t mismatches = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const auto g = std::bit_cast<uint32_t>(got[i]), w = std::bit_cast<uint32_t>(want[i]);
      if (g != w && ++mismatches <= 5) {
        ADD_FAILURE() << type_name(t.type) << " element " << i << ": got " << got[i] << " (0x"
                      << std::hex << g << "), want " << want[i] << " (0x" << w << ")";
      }
    }
    EXPECT_EQ(mismatches, 0u);
  }
}

TEST(Dequant, RowByRowEqualsWholeTensor) {
  const File file = File::open(fixture_path("types.gguf"));
  for (const TensorInfo& t : file.tensors()) {
    std::vector<float> whole(t.n_elements), rows(t.n_elements);
    dequantize(t.type, t.data, whole.data(), t.n_elements);
    const size_t rb = row_bytes(t.type, t.dims[0]);
    for (uint64_t r = 0; r < t.dims[1]; ++r) {
      dequantize(t.type, t.data + r * rb, rows.data() + r * t.dims[0], t.dims[0]);
    }
    EXPECT_EQ(std::memcmp(whole.data(), rows.data(), whole.size() * 4), 0) << t.name;
  }
}

/// Reference binary16 decoding by arithmetic (ldexp is exact here).
uint32_t reference_f16_bits(uint16_t h) {
  const bool neg = h & 0x8000;
  const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  if (exp == 0x1f) return (neg ? 0x80000000u : 0) | 0x7f800000u | (uint32_t(mant) << 13);
  const double mag = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  return std::bit_cast<uint32_t>(static_cast<float>(neg ? -mag : mag));
}

TEST(Dequant, F16ToF32ExhaustiveExact) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    ASSERT_EQ(std::bit_cast<uint32_t>(f16_to_f32(static_cast<uint16_t>(h))),
              reference_f16_bits(static_cast<uint16_t>(h)))
        << "half 0x" << std::hex << h;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);       // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);       // largest finite
  EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)));  // -0
  EXPECT_EQ(f16_to_f32(0x7c00), INFINITY);
  EXPECT_EQ(f16_to_f32(0xfc00), -INFINITY);
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
}

TEST(Dequant, HandBuiltBlocks) {
  // Q4_0: d = 1.0 (0x3c00), byte j = (hi << 4) | lo -> elements j (lo-8), j+16 (hi-8).
  std::vector<uint8_t> q4(18, 0);
  q4[0] = 0x00, q4[1] = 0x3c;
  for (int j = 0; j < 16; ++j) q4[2 + j] = static_cast<uint8_t>((15 - j) << 4 | j);
  float out[32];
  dequantize(TensorType::Q4_0, q4.data(), out, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], j - 8);
    EXPECT_EQ(out[j + 16], 15 - j - 8);
  }
  // Q5_0: d = 1.0; nibble lo = j, hi = 15 - j; fifth bits qh = 0xA5A5F00F
  // (element j's bit j, element j+16's bit j+16) -> value (nibble | bit << 4) - 16.
  std::vector<uint8_t> q5(22, 0);
  q5[0] = 0x00, q5[1] = 0x3c;
  const uint32_t qh = 0xA5A5F00Fu;
  std::memcpy(q5.data() + 2, &qh, 4);
  for (int j = 0; j < 16; ++j) q5[6 + j] = static_cast<uint8_t>((15 - j) << 4 | j);
  dequantize(TensorType::Q5_0, q5.data(), out, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], float(int(j | ((qh >> j) & 1) << 4) - 16)) << j;
    EXPECT_EQ(out[j + 16], float(int((15 - j) | ((qh >> (j + 16)) & 1) << 4) - 16)) << j;
  }
  // Q8_0: d = 0.5 (0x3800), q = -128..
  std::vector<uint8_t> q8(34, 0);
  q8[0] = 0x00, q8[1] = 0x38;
  for (int j = 0; j < 32; ++j) q8[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j * 8 - 128));
  dequantize(TensorType::Q8_0, q8.data(), out, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(out[j], (j * 8 - 128) * 0.5f);
}

TEST(Dequant, RejectsBadRequests) {
  uint8_t src[256] = {};
  float dst[256];
  EXPECT_THROW(dequantize(TensorType::Q4_0, src, dst, 31), Error);
  EXPECT_THROW(dequantize(TensorType::Q6_K, src, dst, 32), Error);
  EXPECT_THROW(dequantize(static_cast<TensorType>(7), src, dst, 32), Error);  // Q5_1
  dequantize(TensorType::F32, nullptr, nullptr, 0);  // empty range: a no-op
  EXPECT_EQ(type_name(static_cast<TensorType>(7)), "type#7");  // Q5_1: not read
  EXPECT_EQ(type_name(TensorType::Q5_0), "Q5_0");
  EXPECT_EQ(type_name(TensorType::Q5_K), "Q5_K");
  EXPECT_FALSE(is_supported(static_cast<TensorType>(99)));
  EXPECT_EQ(block_bytes(TensorType::Q6_K), 210u);
  EXPECT_EQ(block_bytes(TensorType::Q5_K), 176u);
  EXPECT_EQ(block_bytes(TensorType::Q4_K), 144u);
  EXPECT_EQ(row_bytes(TensorType::Q4_1, 64), 40u);
  EXPECT_THROW(row_bytes(TensorType::F32, ~uint64_t{0}), Error);  // overflow
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// Throughput check: 32M Q4_1 elements (the brief asks for 100M in well under a
// second or two; 32M keeps the test's memory modest). Only timed when not
// sanitized, and with a generous bound to stay robust on a loaded machine.
TEST(Dequant, Q4_1IsFast) {
  constexpr uint64_t n = uint64_t{32} << 20;
  std::vector<uint8_t> src(row_bytes(TensorType::Q4_1, n), 0x5a);
  for (size_t b = 0; b < src.size(); b += 20) src[b + 1] = 0x2c, src[b + 3] = 0xac;  // finite d, m
  std::vector<float> dst(n);
  const auto t0 = std::chrono::steady_clock::now();
  dequantize(TensorType::Q4_1, src.data(), dst.data(), n);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("Q4_1 dequant: %.1f M elements/s\n", n / s / 1e6);
  if (!kSanitized) EXPECT_LT(s, 1.0) << "32M Q4_1 elements took " << s << " s";
}

}  // namespace
}  // namespace activekv::gguf
