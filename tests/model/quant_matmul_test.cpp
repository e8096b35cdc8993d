// The CPU block matmul (model/quant_matmul.h): weights exactly
// gguf::dequantize's, the AVX2 and portable kernels bitwise equal, a dot's
// bits independent of how many x rows go together and of the thread count,
// the prefill path (dequantised rows + sgemm) and the fused one within fp32
// rounding of an fp64 reference, and clear errors.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "activekv/core/error.h"
#include "activekv/gguf/tensor_type.h"
#include "activekv/model/quant_matmul.h"

namespace activekv::model {
namespace {

using gguf::TensorType;

uint16_t half_bits(float f) {  // round-to-nearest binary16 of a normal value (test data only)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const int exp = int((u >> 23) & 0xff) - 127 + 15;
  uint32_t mant = (u >> 13) & 0x3ffu;
  if ((u >> 12) & 1u) ++mant;  // round half up: fine for test scales
  return uint16_t(sign | (uint32_t(exp) << 10)) + uint16_t(mant);
}

// Where a block's fp16 scale d is (Q6_K's is last).
size_t scale_offset(TensorType type) { return type == TensorType::Q6_K ? 208 : 0; }

// Random blocks of `type`: scales ~0.01-0.1 (Q4_1's minimum ~ -0.05, Q4_K's
// dmin ~0.005-0.05), every code value; the K-quants' sub-block scales random
// bytes (Q6_K's int8 ones of both signs).
QuantMatrix random_matrix(TensorType type, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng{seed};
  std::uniform_real_distribution<float> scale(0.01f, 0.1f);
  QuantMatrix m;
  m.type = type;
  m.rows = rows;
  m.cols = cols;
  m.blocks.resize(size_t(rows) * m.row_bytes());
  const size_t bb = gguf::block_bytes(type);
  for (size_t b = 0; b < m.blocks.size() / bb; ++b) {
    uint8_t* p = m.blocks.data() + b * bb;
    for (size_t i = 0; i < bb; ++i) p[i] = uint8_t(rng());
    const uint16_t d = half_bits(scale(rng)), mn = half_bits(-0.5f * scale(rng)), dmin = half_bits(0.5f * scale(rng));
    std::memcpy(p + scale_offset(type), &d, 2);
    if (type == TensorType::Q4_1) std::memcpy(p + 2, &mn, 2);
    if (type == TensorType::Q4_K) std::memcpy(p + 2, &dmin, 2);
  }
  return m;
}

std::vector<float> random_x(int n, int64_t cols, uint32_t seed) {
  std::mt19937 rng{seed};
  std::normal_distribution<float> nd;
  std::vector<float> x(size_t(n) * size_t(cols));
  for (float& v : x) v = nd(rng);
  return x;
}

// fp64 dot products over gguf::dequantize's weights.
std::vector<double> reference(const QuantMatrix& w, int n, const std::vector<float>& x) {
  std::vector<float> row(size_t(w.cols));
  std::vector<double> y(size_t(n) * size_t(w.rows));
  for (int64_t r = 0; r < w.rows; ++r) {
    w.dequantize_row(r, row.data());
    for (int t = 0; t < n; ++t) {
      double s = 0;
      for (int64_t c = 0; c < w.cols; ++c) s += double(row[size_t(c)]) * double(x[size_t(t) * size_t(w.cols) + size_t(c)]);
      y[size_t(t) * size_t(w.rows) + size_t(r)] = s;
    }
  }
  return y;
}

// max |y - ref| / max |ref|.
double rel_error(const std::vector<float>& y, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    num = std::max(num, std::fabs(double(y[i]) - ref[i]));
    den = std::max(den, std::fabs(ref[i]));
  }
  return num / den;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

const TensorType kTypes[] = {TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_0,
                             TensorType::Q8_0, TensorType::Q4_K, TensorType::Q6_K};

TEST(QuantMatmul, AvxAndPortableKernelsGiveTheSameBits) {
  if (!cpu_has_avx2_fma()) GTEST_SKIP() << "this CPU lacks AVX2/FMA/F16C: only the portable kernel runs";
  for (TensorType type : kTypes)
    for (int n : {1, 2, 3, 8, kFusedVectors}) {
      const QuantMatrix w = random_matrix(type, 37, 768, 1);  // 37 rows: tasks of 16, 16 and 5
      const std::vector<float> x = random_x(n, w.cols, 2);
      std::vector<float> a(size_t(n) * 37), b(a.size());
      quant_matmul_fused(w, n, x.data(), a.data(), MatmulIsa::avx2);
      quant_matmul_fused(w, n, x.data(), b.data(), MatmulIsa::portable);
      EXPECT_TRUE(same_bits(a, b)) << gguf::type_name(type) << ", " << n << " rows of x";
    }
}

TEST(QuantMatmul, ADotsBitsDoNotDependOnTheBatchOrTheThreads) {
  const QuantMatrix w = random_matrix(TensorType::Q4_1, 100, 1536, 3);
  const int n = 11;
  const std::vector<float> x = random_x(n, w.cols, 4);
  std::vector<float> all(size_t(n) * 100);
  QuantScratch s;
  quant_matmul(w, n, x.data(), all.data(), s);
  for (int t = 0; t < n; ++t) {
    std::vector<float> one(100), want(all.begin() + t * 100, all.begin() + (t + 1) * 100);
    quant_matmul(w, 1, x.data() + size_t(t) * 1536, one.data(), s);
    EXPECT_TRUE(same_bits(one, want)) << "row " << t << " alone against within 11";
  }
  const int threads = omp_get_max_threads();
  std::vector<float> one_thread(all.size()), three(all.size());
  omp_set_num_threads(1);
  quant_matmul(w, n, x.data(), one_thread.data(), s);
  omp_set_num_threads(3);
  quant_matmul(w, n, x.data(), three.data(), s);
  omp_set_num_threads(threads);
  EXPECT_TRUE(same_bits(one_thread, three)) << "1 thread against 3";
  EXPECT_TRUE(same_bits(one_thread, all)) << "1 thread against " << threads;
}

// The prefill path's AVX2 decode gives gguf::dequantize's values, also for
// negative and subnormal (half) scales.
TEST(QuantMatmul, AvxDecodeIsGgufDequantizeBitwise) {
  if (!cpu_has_avx2_fma()) GTEST_SKIP() << "this CPU lacks AVX2/FMA/F16C";
  for (TensorType type : kTypes) {
    QuantMatrix w = random_matrix(type, 9, 256, 8);
    const uint16_t negative = 0xa40d, subnormal = 0x0123;  // -0.0157..., a binary16 subnormal
    const size_t d = scale_offset(type);
    std::memcpy(w.blocks.data() + d, &negative, 2);
    std::memcpy(w.blocks.data() + w.row_bytes() + (256 / gguf::block_elements(type) - 1) * gguf::block_bytes(type) + d,
                &subnormal, 2);  // the row's last block
    std::vector<float> avx(size_t(9) * 256), ref(avx.size());
    dequantize_rows(w, 0, 9, avx.data(), MatmulIsa::avx2);
    dequantize_rows(w, 0, 9, ref.data(), MatmulIsa::portable);
    EXPECT_TRUE(same_bits(avx, ref)) << gguf::type_name(type);
  }
}

// Fewer W rows than a prefill block (and than the 16 it is at least), and none.
TEST(QuantMatmul, SmallMatricesOnThePrefillPath) {
  for (int64_t rows : {0, 1, 5}) {
    const QuantMatrix w = random_matrix(TensorType::Q4_0, rows, 64, 9);
    const int n = kFusedVectors + 3;
    const std::vector<float> x = random_x(n, 64, 10);
    std::vector<float> y(size_t(n) * size_t(rows));
    QuantScratch s;
    quant_matmul(w, n, x.data(), y.data(), s);
    if (rows > 0) EXPECT_LT(rel_error(y, reference(w, n, x)), 1.5e-6) << rows << " rows";
  }
}

TEST(QuantMatmul, FusedAndPrefillPathsAgreeWithFp64) {
  for (TensorType type : kTypes)
    for (int n : {1, kFusedVectors, kFusedVectors + 1, 40}) {
      const QuantMatrix w = random_matrix(type, 300, 1536, 5);  // prefill: row blocks of 170
      const std::vector<float> x = random_x(n, w.cols, 6);
      std::vector<float> y(size_t(n) * 300);
      QuantScratch s;
      quant_matmul(w, n, x.data(), y.data(), s);
      const double err = rel_error(y, reference(w, n, x));
      std::printf("  %s, %d rows of x (%s): max error %.2e of the largest |y|\n", gguf::type_name(type).c_str(), n,
                  n <= kFusedVectors ? "fused" : "prefill", err);
      // fp32 sums of 1536 products, measured on the dev VM (AMD EPYC, AVX2): 1.3e-7 - 3.4e-7 fused,
      // 2.7e-7 - 5.0e-7 through OpenBLAS sgemm (every type; the K-quants the largest). Bound ~3x the largest.
      EXPECT_LT(err, 1.5e-6) << gguf::type_name(type) << ", " << n;
    }
}

TEST(QuantMatmul, BadInputIsRefused) {
  QuantMatrix w = random_matrix(TensorType::Q8_0, 4, 64, 7);
  std::vector<float> x(64 * 20), y(4 * 20);
  QuantScratch s;
  EXPECT_THROW(quant_matmul(w, -1, x.data(), y.data(), s), InvalidArgument);
  QuantMatrix short_blocks = w;
  short_blocks.blocks.pop_back();
  EXPECT_THROW(quant_matmul(short_blocks, 1, x.data(), y.data(), s), InvalidArgument);
  EXPECT_THROW(quant_matmul(short_blocks, 20, x.data(), y.data(), s), InvalidArgument);
  QuantMatrix odd = w;
  odd.cols = 48;  // not whole blocks
  EXPECT_THROW(quant_matmul(odd, 1, x.data(), y.data(), s), InvalidArgument);
  EXPECT_THROW(dequantize_rows(w, 2, 5, y.data(), MatmulIsa::portable), InvalidArgument);
  EXPECT_THROW(quant_matmul_fused(w, kFusedVectors + 1, x.data(), y.data(), MatmulIsa::automatic), InvalidArgument);
  QuantMatrix partial_superblocks = random_matrix(TensorType::Q4_K, 2, 512, 7);
  partial_superblocks.cols = 288;  // whole 32-element units, not whole 256-element super-blocks
  EXPECT_THROW(quant_matmul(partial_superblocks, 1, x.data(), y.data(), s), InvalidArgument);
  w.type = TensorType::Q5_K;
  EXPECT_FALSE(quant_matmul_supports(TensorType::Q5_K));
  EXPECT_THROW(quant_matmul(w, 1, x.data(), y.data(), s), InvalidArgument);
  w.type = TensorType::Q8_0;
  EXPECT_NO_THROW(quant_matmul(w, 0, x.data(), y.data(), s));  // nothing to compute
}

}  // namespace
}  // namespace activekv::model
