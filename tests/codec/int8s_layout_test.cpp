// The int8s section layout (kv/int8s_layout.h) that the CPU codec and the GPU
// kernel share: its offsets are where the encoder wrote each field.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "activekv/kv/codec_int8s.h"

namespace activekv::kv {
namespace {

// The formula of SPEC §3.3, at compile time (what the kernel relies on).
static_assert(Int8sSectionLayout{256, 1024}.bytes() == 4 * 256 + 2 * 1024 + 2 * 1024 * 256);
static_assert(Int8sSectionLayout{64, 16}.value_codes() == 2 * 64 + 2 * 16 + 16 * 64 + 2 * 64);
static_assert(Int8sSectionLayout{64, 16}.head_offset(2) == kCodecHeaderBytes + 2 * Int8sSectionLayout{64, 16}.bytes());

TEST(Int8sLayout, OffsetsAreWhereTheEncoderWroteEachField) {
  const KvShape s{1, 3, 64, 48};
  const int n = 40;  // a partial page: sections are sized by the tokens stored
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<bf16> page(s.page_elements());
  for (auto& x : page) x = f32_to_bf16(nd(rng));
  const EncodedPage e = encode_int8s_page(s, page, n);
  const Int8sSectionLayout lay{size_t(s.head_dim), size_t(n)};
  EXPECT_EQ(e.bytes.size(), lay.head_offset(s.n_kv_heads));
  EXPECT_EQ(int8s_payload_bytes(s.n_kv_heads, s.head_dim, n), lay.payload_bytes(s.n_kv_heads));
  const Int8sPageView v = parse_int8s_page(e);
  for (int h = 0; h < s.n_kv_heads; ++h) {
    const std::byte* sec = e.bytes.data() + lay.head_offset(h);
    EXPECT_EQ(static_cast<const void*>(v.head(h).kq), static_cast<const void*>(sec + lay.key_codes()));
    EXPECT_EQ(static_cast<const void*>(v.head(h).vq), static_cast<const void*>(sec + lay.value_codes()));
    uint16_t c0, s0, v0;  // first key channel, key token and value channel scale, as fp16 bits
    std::memcpy(&c0, sec + lay.key_channel_scales(), 2);
    std::memcpy(&s0, sec + lay.key_token_scales(), 2);
    std::memcpy(&v0, sec + lay.value_channel_scales(), 2);
    auto half = [](uint16_t b) {  // fp16 -> float for normal numbers and zero (all a scale here can be)
      if ((b & 0x7fffu) == 0) return 0.f;
      const uint32_t f = (uint32_t(b & 0x8000u) << 16) | ((uint32_t((b >> 10) & 0x1f) + 112) << 23) |
                         (uint32_t(b & 0x3ffu) << 13);
      float x;
      std::memcpy(&x, &f, 4);
      return x;
    };
    EXPECT_EQ(half(c0), v.head(h).c(0)) << "head " << h;
    EXPECT_EQ(half(s0), v.head(h).s(0)) << "head " << h;
    EXPECT_EQ(half(v0), v.head(h).v(0)) << "head " << h;
  }
}

}  // namespace
}  // namespace activekv::kv
