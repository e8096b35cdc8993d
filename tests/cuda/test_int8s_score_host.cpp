// The int8s kernels' score arithmetic (src/cuda/int8s_score.cuh) on the CPU:
// the division-free lo / 127 is the correctly rounded quotient for every
// integer the kernels can give it, so the GPU scores keep the bits of the
// CPU kernels' `lo / 127.f` (the fma-corrected step is IEEE arithmetic, the
// same on both sides).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "int8s_score.cuh"

namespace activekv::cuda::detail {
namespace {

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

TEST(Int8sScore, Div127IsTheRoundedQuotientOfEveryIntegerUpTo2To24) {
  // |lo| <= head_dim * 127 * 127 <= 512 * 16129 < 2^23; the range checked is wider.
  long wrong = 0, naive_wrong = 0;
  for (int32_t i = -(1 << 24); i <= (1 << 24); ++i) {
    const float x = float(i), want = x / 127.f;
    wrong += bits(div127_rn(x)) != bits(want);
    naive_wrong += bits(x * (1.f / 127.f)) != bits(want);  // the uncorrected product, as a control
  }
  EXPECT_EQ(wrong, 0);
  // Measured: 1,568,740 of the 33.5M integers differ without the correction,
  // so the comparison above can fail.
  EXPECT_GT(naive_wrong, 1000000);
}

TEST(Int8sScore, ScoreIsTheReferenceExpression) {
  const int dots[][2] = {{0, 0}, {16129 * 256, -16129 * 256}, {-12345, 6789}, {1, -1}, {77, 127 * 3}};
  const float scales[][2] = {{1.f, 1.f}, {0.0123f, 1.4427f}, {3.5e-3f, 0.0883f}};
  for (const auto& d : dots)
    for (const auto& s : scales) {
      const float want = ((float(d[0]) + float(d[1]) / 127.f) * s[0]) * s[1];
      EXPECT_EQ(bits(int8s_score(d[0], d[1], s[0], s[1])), bits(want)) << d[0] << " " << d[1];
    }
}

}  // namespace
}  // namespace activekv::cuda::detail
