// GPU tests of the compressed formats (issue 5): the int8s kernels (legacy and
// tc, issue 13) against the CPU int8s kernel and against the fp64 reference over the dequantised
// history, its SPEC §4 switches, the lossless13 unpack (bitwise the bf16
// route), the hybrid route through the engine (streamed == resident == mixed
// placements bitwise, repeatable, own-format error within the contract;
// route and placement switches between steps == a fresh engine), and a
// corrupt lossless13 directory that must come out as NaN rather than an
// out-of-bounds read.
// Labelled `gpu` (see CMakeLists.txt).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "activekv/attention/attention_codecs.h"
#include "activekv/attention/quality.h"
#include "activekv/cuda/decode_engine.h"
#include "activekv/cuda/device_pages.h"
#include "activekv/cuda/format_kernels.h"
#include "activekv/cuda/int8s_tile.h"
#include "activekv/cuda/pinned_memory.h"
#include "activekv/eval/quality_eval.h"
#include "activekv/kv/codec.h"
#include "activekv/route/route.h"
#include "gpu_test_util.h"
#include "route_fixture.h"

namespace activekv::cuda {
namespace {

using namespace testing_routes;

// ---------------------------------------------------------------------------
// The int8s kernel through Int8sTileRunner vs the CPU kernel and fp64.

struct TileCase {
  int n_kv, group, head_dim, page_size;
  int64_t tokens;
  Int8sKernel kernel = Int8sKernel::legacy;
  std::string tc_config;  // tc kernel: its launch configuration ("" = default)
};

std::string tile_case_name(const ::testing::TestParamInfo<TileCase>& i) {
  const TileCase& c = i.param;
  return std::string(int8s_kernel_name(c.kernel)) + (c.tc_config.empty() ? "" : "_" + c.tc_config) + "_kv" +
         std::to_string(c.n_kv) + "_g" + std::to_string(c.group) + "_d" + std::to_string(c.head_dim) + "_p" +
         std::to_string(c.page_size) + "_t" + std::to_string(c.tokens);
}

class Int8sTile : public ::testing::TestWithParam<TileCase> {};

// The largest difference between two kernels' partials: on O relative to
// the row's largest |O| (per row and head), on LSE absolute.
struct KernelDiff {
  double o = 0, lse = 0;
};
KernelDiff kernel_diff(const attention::Partial& a, const attention::Partial& b, int rows, int nq, int head_dim) {
  KernelDiff d;
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < nq; ++h) {
      double num = 0, den = 0;
      for (int j = 0; j < head_dim; ++j) {
        num = std::max(num, double(std::fabs(a.o_at(r, h)[j] - b.o_at(r, h)[j])));
        den = std::max(den, double(std::fabs(b.o_at(r, h)[j])));
      }
      d.o = std::max(d.o, den > 0 ? num / den : num);
      d.lse = std::max(d.lse, double(std::fabs(a.lse_at(r, h) - b.lse_at(r, h))));
    }
  return d;
}

TEST_P(Int8sTile, MatchesCpuKernelAndOwnFormatBound) {
  NEED_GPU();
  const TileCase c = GetParam();
  const kv::KvShape s{1, c.n_kv, c.head_dim, c.page_size};
  kv::PageStore store(s);
  kv::SequenceKv seq(store);
  fill_history(seq, s, c.tokens, 7);
  std::vector<kv::EncodedPage> enc;
  const int64_t full = c.tokens / c.page_size;
  for (int64_t p = 0; p < full; ++p)
    enc.push_back(kv::encode_page(kv::CodecFormat::int8s, store, seq.page_table(0)[size_t(p)], c.page_size));
  std::vector<const kv::EncodedPage*> ptrs;
  for (const auto& e : enc) ptrs.push_back(&e);
  const int nq = c.n_kv * c.group, rows = 5;
  const std::vector<float> q = random_queries(size_t(rows) * nq * c.head_dim, 11);
  // Rows inside the tile (causal cut mid-page), at its end, and one before any key would be.
  std::vector<int64_t> pos{full * c.page_size - 1, c.page_size + 3, 2 * c.page_size - 1, c.page_size / 2,
                           full * c.page_size - 7};
  const attention::QueryRows qr{q.data(), rows, nq, pos.data()};
  const attention::DenseHistoryF64 ref_h = attention::dequantize_history(ptrs, 0, full * c.page_size);
  const attention::ReferencePartial ref = attention::reference_attention(ref_h, qr, {});
  for (int terms : {1, 2}) {
    attention::AttentionOptions opt;
    opt.int8s_query_terms = terms;
    const attention::Partial cpu = attention::attend_int8s_tile(ptrs, 0, full * c.page_size, qr, opt);
    Int8sKernelOptions kopt;
    kopt.kernel = c.kernel;
    kopt.tc = parse_int8s_tc_config(c.tc_config);
    const attention::Partial gpu = Int8sTileRunner{kopt}(ptrs, 0, full * c.page_size, qr, opt);
    const KernelDiff diff = kernel_diff(gpu, cpu, rows, nq, c.head_dim);
    const double worst = diff.o, worst_lse = diff.lse;
    const double own_gpu = attention::own_format_error(gpu, ref), own_cpu = attention::own_format_error(cpu, ref);
    std::printf("  %s kernel %s, d=%d group %d page %d split %d, %d-term query: GPU vs CPU kernel %.2e (LSE %.2e), "
                "own-format GPU %.3e CPU %.3e (differ by %.2e)\n", int8s_kernel_name(c.kernel),
                c.kernel == Int8sKernel::tc ? int8s_tc_config_name(resolve_int8s_tc_config(kopt.tc, c.head_dim)).c_str()
                                            : "",
                c.head_dim, c.group,
                c.page_size, default_split_tokens(c.page_size), terms, worst, worst_lse, own_gpu, own_cpu,
                std::fabs(own_gpu - own_cpu));
    // Same codes and integer dot products; the GPU sums in another order and
    // in base 2, so they differ by fp32 rounding. Measured on the H200 at
    // 74e267f and again at d68a9cb (bench/results/h200_device_tests_run.log, every shape and both
    // query terms): at most 4.13e-6 on O, 3.81e-6 on LSE. Bounds: ~3x that.
    // (Before the FMA-contraction fix of the query residual the O difference
    // was 3.8e-5: these bounds catch it; the old 1e-4 did not.)
    // The tc kernel (measured at 546544a, h200_gtest_546544a.json: at most
    // 4.28e-6 on O, 3.81e-6 on LSE, so the bounds are ~3.5x): same integer dots, score expression,
    // base-2 softmax and LSE arithmetic; it adds only the two f16 terms of each
    // weight (<= 2^-22 relative, test_int8s_tc.cpp) and another fp32
    // summation order of P.V (tensor cores, 16 tokens per mma: a linear bound of
    // ~(16 + 32) * 2^-23 ~ 6e-6 relative to sum |p v| per split, against the
    // legacy kernel's sequential chain of up to 512 fmaf). So the same bounds;
    // the printed figure lets the lead tighten them to ~3x the measured.
    EXPECT_LT(worst, 1.5e-5) << "GPU and CPU int8s kernels compute the same codes and dot products";
    EXPECT_LT(worst_lse, 1.2e-5);
    // |own_gpu - own_cpu| <= max_row |O_gpu - O_cpu|_inf / |O_ref|_inf <= worst * (1 + own_cpu) (triangle
    // inequality): at most ~2.4e-6 at d68a9cb, where the printed errors (4 digits) differ by <= 1e-6
    // for two terms. Bound: ~3x (the old 1e-4 was 40x).
    EXPECT_NEAR(own_gpu, own_cpu, 7e-6);
    // SPEC §5 bounds the two-term error by 0.005; measured at d68a9cb (same log): at most 4.1e-4
    // (d=256 group 8). Asserted at ~3x the measurement, well inside the contract.
    if (terms == 2) EXPECT_LE(own_gpu, 1.25e-3) << "own-format error (SPEC §5 contract: 0.005)";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Int8sTile,
                         ::testing::Values(TileCase{2, 3, 64, 256, 1024}, TileCase{4, 6, 256, 1024, 4096},
                                           TileCase{3, 3, 64, 1024, 3072},
                                           // 8 query heads per KV head; 480-token splits (not a multiple of 128)
                                           TileCase{1, 8, 64, 960, 1920}, TileCase{2, 8, 256, 960, 1920}));

// The tc kernel (issue 13) on the same shapes and on every group it is
// instantiated for (3 SmolLM2, 4 Gemma 3 270M, 6 the 27B shape, 7 qwen2-0.5B,
// 8), head_dim 64 and 256. The rows cut pages mid-split (partial splits, a
// partly filled last 16-token block); page 1040 has 260-token splits, so
// splits start off a 16-token (and 8-token) boundary and end mid-block.
constexpr Int8sKernel kTc = Int8sKernel::tc;
const std::vector<TileCase> kTcShapes{
    TileCase{2, 3, 64, 256, 1024, kTc},  TileCase{4, 6, 256, 1024, 4096, kTc}, TileCase{3, 3, 64, 1024, 3072, kTc},
    TileCase{1, 8, 64, 960, 1920, kTc},  TileCase{2, 8, 256, 960, 1920, kTc},  TileCase{2, 4, 256, 512, 2048, kTc},
    TileCase{1, 4, 64, 240, 960, kTc},   TileCase{1, 7, 64, 512, 1536, kTc},   TileCase{2, 7, 256, 1024, 2048, kTc},
    TileCase{1, 6, 64, 1040, 2080, kTc}, TileCase{1, 3, 256, 1040, 2080, kTc}};
INSTANTIATE_TEST_SUITE_P(TcShapes, Int8sTile, ::testing::ValuesIn(kTcShapes), tile_case_name);

// Every instantiated launch configuration of the tc kernel (Int8sTcConfig:
// warps, ring stages, blocks per stage; ACTIVEKV_INT8S_TC_CONFIG picks one
// at run time) on every shape above, under the same bounds: they differ only
// in which warp sums which tokens. The 260-token splits of page 1040 end
// mid-stage for 32-token stages (b2), and splits of fewer stages than warps
// leave warps without work.
std::vector<TileCase> tc_config_cases() {
  std::vector<TileCase> out;
  for (const std::string& cfg : int8s_tc_config_names())
    for (TileCase c : kTcShapes) {
      c.tc_config = cfg;
      out.push_back(c);
    }
  return out;
}
INSTANTIATE_TEST_SUITE_P(TcConfigs, Int8sTile, ::testing::ValuesIn(tc_config_cases()), tile_case_name);

TEST(Int8sTile, SyntheticOutlierCaseWithinBound) {
  NEED_GPU();
  for (Int8sKernel k : {Int8sKernel::legacy, Int8sKernel::tc}) {
    // The eval's 64K synthetic case at 16K tokens (same construction), GPU kernel.
    Int8sKernelOptions kopt;
    kopt.kernel = k;
    const route::Int8sTileFn gpu = Int8sTileRunner{kopt};
    const eval::SyntheticErrors e = eval::synthetic_outlier_errors(16384, 1024, 3, 64, 9, 2, 32, gpu);
    std::printf("  %s kernel, synthetic 16K: separable one-term %.3e two-term %.3e; per-token one-term %.3e "
                "two-term %.3e\n", int8s_kernel_name(k), e.separable[0], e.separable[1], e.per_token[0],
                e.per_token[1]);
    // SPEC §5 bound: 0.005. Measured on the H200 (legacy at d68a9cb, bench/results/h200_device_tests_run.log;
    // tc at ca5fc0b, h200_int8s_tc_tests.log): one-term 6.01e-4 both, two-term 3.20e-6 legacy, 3.26e-6 tc.
    // Bounds: ~3x those.
    EXPECT_LE(e.separable[1], 1e-5) << int8s_kernel_name(k);
    EXPECT_LE(e.separable[0], 1.8e-3) << int8s_kernel_name(k);
  }
}

// Degenerate scales (a review's gap): an all-zero page (neutral channel
// scales, zero token scales, zero codes), a zero key channel and zero key
// tokens, a channel ~2^12 and one ~2^-20 against ~1 elsewhere (channel scales
// at or near their clamps), and values ~2^-20 (fp16-subnormal token scales).
// The query is small on the large channel so that scores stay in a moderate
// range: the test is of the scales, not of fp32 rounding at huge scores.
// Each GPU kernel against the CPU kernel under the bounds of
// MatchesCpuKernelAndOwnFormatBound (same codes and integer dots), and
// every output finite. Not yet run on a GPU (written in session 24).
TEST(Int8sTile, DegenerateScalesMatchCpuKernel) {
  NEED_GPU();
  constexpr int n_kv = 2, group = 4, hd = 64, P = 256, pages = 4;
  const kv::KvShape s{1, n_kv, hd, P};
  kv::PageStore store(s);
  kv::SequenceKv seq(store);
  const int row = n_kv * hd;
  const int64_t n = int64_t(pages) * P;
  std::mt19937 rng{5};
  std::normal_distribution<float> nd;
  std::vector<float> k(size_t(n) * row), v(k.size());
  for (int64_t t = 0; t < n; ++t)
    for (int i = 0; i < row; ++i) {
      const size_t x = size_t(t) * row + size_t(i);
      const int page = int(t / P), ch = i % hd;
      k[x] = nd(rng);
      v[x] = nd(rng);
      if (page == 1) k[x] = v[x] = 0.f;                           // an all-zero page
      if (page == 2 && ch == 3) k[x] = 0.f;                        // a zero key channel
      if (page == 2 && t % P == 9) k[x] = 0.f;                     // a zero key token
      if (page == 2 && ch == 0) k[x] *= 0x1p12f;                   // a large channel
      if (page == 2 && ch == 1) k[x] *= 0x1p-20f;                  // a tiny channel
      if (page == 3) { k[x] *= 0x1p-20f; v[x] *= 0x1p-20f; }      // tiny values: subnormal fp16 token scales
    }
  seq.reserve(n);
  seq.write(0, 0, n, k.data(), v.data());
  seq.commit(n);
  std::vector<kv::EncodedPage> enc;
  for (int p = 0; p < pages; ++p) enc.push_back(kv::encode_page(kv::CodecFormat::int8s, store, seq.page_table(0)[size_t(p)], P));
  std::vector<const kv::EncodedPage*> ptrs;
  for (const auto& e : enc) ptrs.push_back(&e);
  const int nq = n_kv * group, rows = 3;
  std::vector<float> q = random_queries(size_t(rows) * nq * hd, 13);
  for (size_t i = 0; i < q.size(); i += hd) q[i] *= 0x1p-12f;  // channel 0 of every head
  std::vector<int64_t> pos{n - 1, 2 * P + 100, P + 10};  // rows that see: every page; 0-2 (cut in 2); 0-1 (cut in 1)
  const attention::QueryRows qr{q.data(), rows, nq, pos.data()};
  for (Int8sKernel kernel : {Int8sKernel::legacy, Int8sKernel::tc}) {
    for (int terms : {1, 2}) {
      attention::AttentionOptions opt;
      opt.int8s_query_terms = terms;
      const attention::Partial cpu = attention::attend_int8s_tile(ptrs, 0, n, qr, opt);
      Int8sKernelOptions kopt;
      kopt.kernel = kernel;
      const attention::Partial gpu = Int8sTileRunner{kopt}(ptrs, 0, n, qr, opt);
      bool finite = true;
      for (int r = 0; r < rows; ++r)
        for (int h = 0; h < nq; ++h) {
          finite = finite && std::isfinite(gpu.lse_at(r, h));
          for (int j = 0; j < hd; ++j) finite = finite && std::isfinite(gpu.o_at(r, h)[j]);
        }
      const KernelDiff d = kernel_diff(gpu, cpu, rows, nq, hd);
      std::printf("  %s kernel, degenerate scales, %d-term query: GPU vs CPU kernel %.2e (LSE %.2e)\n",
                  int8s_kernel_name(kernel), terms, d.o, d.lse);
      EXPECT_TRUE(finite) << int8s_kernel_name(kernel) << ": every output finite";
      EXPECT_LT(d.o, 1.5e-5) << int8s_kernel_name(kernel) << ", " << terms << "-term query";
      EXPECT_LT(d.lse, 1.2e-5) << int8s_kernel_name(kernel) << ", " << terms << "-term query";
    }
  }
}

// ---------------------------------------------------------------------------
// The engine over every route.

TEST(FormatRoutes, StreamedEqualsResidentAndErrorsWithinContract) {
  NEED_GPU();
  RouteFixture f;
  const std::vector<float> exact = f.run("bf16", Placement::resident, 0);
  for (const std::string route : {"bf16", "lossless13", "int8s", "hybrid"}) {
    const std::vector<float> res = f.run(route, Placement::resident, 0);
    const std::vector<float> st3 = f.run(route, Placement::streamed, 3);
    const std::vector<float> st1 = f.run(route, Placement::streamed, 1);
    const std::vector<float> whole = f.run(route, Placement::streamed, 0);
    EXPECT_TRUE(same_bits(res, st3)) << route << ": streamed (3-page tiles) == resident";
    EXPECT_TRUE(same_bits(res, st1)) << route << ": streamed (1-page tiles) == resident";
    EXPECT_TRUE(same_bits(res, whole)) << route << ": whole-layer staging == resident";
    EXPECT_TRUE(same_bits(res, f.run(route, Placement::mixed, 3)))
        << route << ": half the pages resident, half streamed (3-page tiles) == resident";
    EXPECT_TRUE(same_bits(res, f.run(route, Placement::resident, 0))) << route << ": repeatable";
    const double err = f.own_format_error(route, res);
    std::printf("  route %-10s own-format error vs fp64 over its dequantised history: %.3e\n", route.c_str(), err);
    // Measured on the H200 at d68a9cb (bench/results/h200_device_tests_run.log): bf16 and lossless13
    // 5.53e-7 (fp32 rounding), int8s 1.41e-4, hybrid 1.14e-4 (SPEC §5 contract: 0.005). Bounds: ~3x.
    if (route == "bf16" || route == "lossless13") EXPECT_LT(err, 1.7e-6);
    else EXPECT_LE(err, 4.5e-4);
    if (route == "lossless13") EXPECT_TRUE(same_bits(res, exact)) << "lossless13 must give the bf16 route's bits";
  }
}

TEST(FormatRoutes, Int8sSwitches) {
  NEED_GPU();
  RouteFixture f;
  for (const std::string route : {"int8s", "hybrid"}) {
    Int8sKernelOptions on, off;
    off.skip_unit_rescale = false;
    const std::vector<float> a = f.run(route, Placement::resident, 0, on), b = f.run(route, Placement::resident, 0, off);
    EXPECT_TRUE(same_bits(a, b)) << route << ": skipping unit rescales (SPEC §4 trick 1) must change no bit";
    Int8sKernelOptions p2;
    p2.pow2_reference = true;
    const std::vector<float> c = f.run(route, Placement::resident, 0, p2), d = f.run(route, Placement::streamed, 2, p2);
    EXPECT_TRUE(same_bits(c, d)) << route << ": pow2 reference, streamed == resident";
    double worst = 0;
    for (size_t i = 0; i < f.q.size(); ++i) worst = std::max(worst, double(std::fabs(c[i] - a[i])));
    std::printf("  %s: pow2 reference vs default, max |dO| %.2e\n", route.c_str(), worst);
    // Measured at d68a9cb (h200_device_tests_run.log): 7.15e-7 (int8s), 4.77e-7 (hybrid). Bound: ~3x.
    EXPECT_LT(worst, 2.2e-6) << "trick 2 only moves fp32 rounding";
    EXPECT_LE(f.own_format_error(route, c), 4.5e-4) << "as without trick 2 (StreamedEqualsResident...)";
    Int8sKernelOptions dp4a;
    dp4a.tensor_cores = false;
    EXPECT_TRUE(same_bits(a, f.run(route, Placement::resident, 0, dp4a)))
        << route << ": int8 tensor cores and dp4a compute the same integer dot products";
    dp4a.query_terms = 1;
    Int8sKernelOptions one;
    one.query_terms = 1;
    EXPECT_TRUE(same_bits(f.run(route, Placement::resident, 0, one), f.run(route, Placement::resident, 0, dp4a)))
        << route << ": same with a one-term query";
    const double e1 = f.own_format_error(route, f.run(route, Placement::resident, 0, one));
    const double e2 = f.own_format_error(route, a);
    std::printf("  %s: own-format error one-term query %.3e, two-term %.3e\n", route.c_str(), e1, e2);
    // Measured at d68a9cb (h200_device_tests_run.log): the second term cuts the error 162x (int8s)
    // and 190x (hybrid). Asserted: at least 50x (~3x margin).
    EXPECT_LT(e2 * 50, e1) << "the residual term reduces query rounding";
  }
}

// The tc int8s kernel (issue 13) through the engine (group 3, head_dim 64,
// 64-token pages, 32-token splits): the placement and repeatability claims of
// StreamedEqualsResident..., the SPEC §4 switches bitwise as for the legacy
// kernel, the residual query term, and its distance to the legacy kernel.
TEST(FormatRoutes, TcKernelPlacementsSwitchesAndLegacyDistance) {
  NEED_GPU();
  RouteFixture f;
  Int8sKernelOptions tc;
  tc.kernel = Int8sKernel::tc;
  for (const std::string route : {"int8s", "hybrid"}) {
    const std::vector<float> res = f.run(route, Placement::resident, 0, tc);
    for (float x : res) ASSERT_FALSE(std::isnan(x)) << route << ": an output left unwritten (NaN poison)";
    EXPECT_TRUE(same_bits(res, f.run(route, Placement::streamed, 3, tc))) << route << ": streamed (3-page tiles)";
    EXPECT_TRUE(same_bits(res, f.run(route, Placement::streamed, 1, tc))) << route << ": streamed (1-page tiles)";
    EXPECT_TRUE(same_bits(res, f.run(route, Placement::streamed, 0, tc))) << route << ": whole-layer staging";
    EXPECT_TRUE(same_bits(res, f.run(route, Placement::mixed, 3, tc))) << route << ": mixed placement";
    EXPECT_TRUE(same_bits(res, f.run(route, Placement::resident, 0, tc))) << route << ": repeatable";
    const double err = f.own_format_error(route, res);
    // Bound of StreamedEqualsResident... (legacy measured 1.41e-4 int8s, 1.14e-4 hybrid): the tc kernel
    // differs from the legacy one by fp32 rounding only (below).
    EXPECT_LE(err, 4.5e-4) << route;

    Int8sKernelOptions legacy_kernel;  // named: the default is auto (tc here)
    legacy_kernel.kernel = Int8sKernel::legacy;
    const std::vector<float> legacy = f.run(route, Placement::resident, 0, legacy_kernel);
    const size_t n_o = f.q.size();
    double d_o = 0, o_max = 0, d_lse = 0;
    for (size_t i = 0; i < n_o; ++i) {
      d_o = std::max(d_o, double(std::fabs(res[i] - legacy[i])));
      o_max = std::max(o_max, double(std::fabs(legacy[i])));
    }
    for (size_t i = n_o; i < res.size(); ++i) d_lse = std::max(d_lse, double(std::fabs(res[i] - legacy[i])));
    std::printf("  %s: tc vs legacy kernel max |dO| / max |O| %.2e, max |dLSE| %.2e; tc own-format error %.3e\n",
                route.c_str(), d_o / o_max, d_lse, err);
    // Measured on the H200 at ca5fc0b (bench/results/h200_int8s_tc_tests.log): int8s 2.87e-7 on O,
    // 4.77e-7 on LSE; hybrid 2.39e-7, 9.54e-7. Bounds: ~3x the worst. (Then the default tc
    // configuration was w2s3; it is w4s2c now, which passed these bounds against w2s3 in
    // TcConfigsThroughTheEngine at b0220f2; its distance to legacy is printed above.)
    EXPECT_LT(d_o / o_max, 9e-7) << route;
    EXPECT_LT(d_lse, 3e-6) << route;

    Int8sKernelOptions off = tc;
    off.skip_unit_rescale = false;
    EXPECT_TRUE(same_bits(res, f.run(route, Placement::resident, 0, off)))
        << route << ": skipping unit rescales (SPEC §4 trick 1) must change no bit";
    Int8sKernelOptions p2 = tc;
    p2.pow2_reference = true;
    const std::vector<float> c = f.run(route, Placement::resident, 0, p2);
    EXPECT_TRUE(same_bits(c, f.run(route, Placement::streamed, 2, p2))) << route << ": pow2 reference, streamed";
    double worst = 0;
    for (size_t i = 0; i < n_o; ++i) worst = std::max(worst, double(std::fabs(c[i] - res[i])));
    std::printf("  %s: tc kernel, pow2 reference vs default, max |dO| %.2e\n", route.c_str(), worst);
    // Measured on the H200 at ca5fc0b: legacy 7.15e-7 (bound 2.2e-6); tc 5.36e-7 (int8s), 5.96e-7
    // (hybrid). Bound: ~3x the tc figure.
    EXPECT_LT(worst, 1.8e-6) << route << ": trick 2 only moves fp32 rounding";
    EXPECT_LE(f.own_format_error(route, c), 4.5e-4) << route;

    Int8sKernelOptions one = tc;
    one.query_terms = 1;
    const double e1 = f.own_format_error(route, f.run(route, Placement::resident, 0, one));
    std::printf("  %s: tc kernel own-format error one-term query %.3e, two-term %.3e\n", route.c_str(), e1, err);
    EXPECT_LT(err * 50, e1) << route << ": the residual term reduces query rounding (as for the legacy kernel)";
  }
}

// Every launch configuration of the tc kernel through the engine (hybrid: bf16
// and int8s partials of one layer merged), head_dim 64 and the 27B shape's
// 256: streamed == resident bitwise, repeatable, and within fp32 rounding of
// the default configuration (they differ only in which warp sums which
// tokens). The fixture's 32-token splits are one stage of a b2 configuration
// and leave two of four warps without tokens.
TEST(FormatRoutes, TcConfigsThroughTheEngine) {
  NEED_GPU();
  for (const AttnShape& shape : {AttnShape{2, 3, 64, 64, 32, 0.f}, AttnShape{4, 6, 256, 64, 32, 0.f}}) {
    RouteFixture f(shape);
    Int8sKernelOptions base;
    base.kernel = Int8sKernel::tc;
    for (const std::string route : {"int8s", "hybrid"}) {
      const std::vector<float> def = f.run(route, Placement::resident, 0, base);
      const size_t n_o = f.q.size();
      for (const std::string& cfg : int8s_tc_config_names()) {
        SCOPED_TRACE(route + ", head_dim " + std::to_string(shape.head_dim) + ", configuration " + cfg);
        Int8sKernelOptions k = base;
        k.tc = parse_int8s_tc_config(cfg);
        const std::vector<float> res = f.run(route, Placement::resident, 0, k);
        for (float x : res) ASSERT_FALSE(std::isnan(x)) << "an output left unwritten (NaN poison)";
        EXPECT_TRUE(same_bits(res, f.run(route, Placement::streamed, 3, k))) << "streamed (3-page tiles)";
        EXPECT_TRUE(same_bits(res, f.run(route, Placement::resident, 0, k))) << "repeatable";
        double d_o = 0, o_max = 0, d_lse = 0;
        for (size_t i = 0; i < n_o; ++i) {
          d_o = std::max(d_o, double(std::fabs(res[i] - def[i])));
          o_max = std::max(o_max, double(std::fabs(def[i])));
        }
        for (size_t i = n_o; i < res.size(); ++i) d_lse = std::max(d_lse, double(std::fabs(res[i] - def[i])));
        std::printf("  %s d=%d %s vs default configuration: max |dO| / max |O| %.2e, max |dLSE| %.2e\n",
                    route.c_str(), shape.head_dim, cfg.c_str(), d_o / o_max, d_lse);
        // Not yet measured on the H200: the bounds of tc vs legacy (above), a larger reordering
        // (every token's P.V sum); the printed figures let the lead tighten them to ~3x.
        EXPECT_LT(d_o / o_max, 9e-7);
        EXPECT_LT(d_lse, 3e-6);
      }
    }
  }
}

TEST(Int8sTcConfig, NamesParseAndResolve) {
  // Host only: no GPU needed.
  const std::vector<std::string>& names = int8s_tc_config_names();
  ASSERT_GE(names.size(), 2u);
  EXPECT_EQ(names[0], "w4s2cv");  // the defaults first: head_dim 256 (the sweep's choice), then 64
  EXPECT_EQ(names[1], "w4s4");
  for (const std::string& n : names) EXPECT_EQ(int8s_tc_config_name(parse_int8s_tc_config(n)), n);
  EXPECT_TRUE(parse_int8s_tc_config("").is_default());
  EXPECT_TRUE(parse_int8s_tc_config("default").is_default());
  const Int8sTcConfig b2 = parse_int8s_tc_config("w2s2b2");
  EXPECT_EQ(b2.warps, 2);
  EXPECT_EQ(b2.stages, 2);
  EXPECT_EQ(b2.blocks, 2);
  EXPECT_FALSE(b2.channel_rows);
  EXPECT_TRUE(parse_int8s_tc_config("w4s2c").channel_rows);
  EXPECT_FALSE(parse_int8s_tc_config("w4s2c").single_v);
  const Int8sTcConfig v = parse_int8s_tc_config("w4s2cv");
  EXPECT_TRUE(v.channel_rows && v.single_v && v.warps == 4 && v.stages == 2);
  EXPECT_EQ(parse_int8s_tc_config("w3s2c").warps, 3);
  for (const char* bad : {"w3s2", "w2s9", "w2s2b1", "fast", "w2", "w2s3cc", "w4s2v", "w4s2vc"}) {
    try {
      parse_int8s_tc_config(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("is not instantiated (w4s2cv, w4s4, w2s3"), std::string::npos) << e.what();
    }
  }
  if (!std::getenv("ACTIVEKV_INT8S_TC_CONFIG")) {  // the environment overrides the default
    EXPECT_EQ(int8s_tc_config_name(resolve_int8s_tc_config({}, 256)), "w4s2cv");
    EXPECT_EQ(int8s_tc_config_name(resolve_int8s_tc_config({}, 64)), "w4s4");
  }
  EXPECT_EQ(int8s_tc_config_name(resolve_int8s_tc_config(parse_int8s_tc_config("w4s2"), 256)), "w4s2");
  EXPECT_THROW(resolve_int8s_tc_config(Int8sTcConfig{3, 2, 1}, 256), InvalidArgument);
}

// The int8s kernel's shared memory limit is set per device
// (src/cuda/once_per_device.h): every GPU must run the hybrid route (bf16 and
// int8s kernels) and get GPU 0's bits. Exercised only with two GPUs or more.
TEST(FormatRoutes, EveryDeviceGetsTheSameBits) {
  NEED_GPU();
  const int n_dev = testing::gpu_count();
  if (n_dev < 2) GTEST_SKIP() << "one GPU: nothing to compare across devices";
  RouteFixture f;
  for (Int8sKernel k : {Int8sKernel::legacy, Int8sKernel::tc}) {
    Int8sKernelOptions kopt;
    kopt.kernel = k;
    const std::vector<float> ref = f.run("hybrid", Placement::resident, 0, kopt);
    for (int d = 1; d < n_dev; ++d) {
      CUDA_OK(cudaSetDevice(d));
      std::vector<float> got;
      try {
        got = f.run("hybrid", Placement::streamed, 3, kopt);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "GPU " << d << ": " << e.what();
      }
      EXPECT_TRUE(same_bits(ref, got)) << int8s_kernel_name(k) << " kernel: GPU " << d << " differs from GPU 0";
    }
    CUDA_OK(cudaSetDevice(0));
  }
}

TEST(FormatRoutes, BadTablesAreRejectedAndLeaveNoBatch) {
  NEED_GPU();
  RouteFixture f;
  DecodeEngine eng(f.config(2));
  eng.update(f.tables("hybrid"));
  std::vector<SeqPages> bad = f.tables("hybrid");
  PageRef& r = bad[0].tables[1][1];  // an int8s page
  ASSERT_EQ(r.kind, PageKind::int8s);
  r.bytes -= 256;  // a short blob whose header still matches it would be read past its end
  EXPECT_THROW(eng.update(bad), InvalidArgument);
  EXPECT_THROW(eng.begin_step(), InvalidArgument) << "a failed update leaves no batch to run";
  r = f.tables("hybrid")[0].tables[1][1];
  r.kind = PageKind::lossless13;  // an int8s blob named lossless13
  EXPECT_THROW(eng.update(bad), InvalidArgument);
  EXPECT_THROW(eng.begin_step(), InvalidArgument);
  eng.update(f.tables("hybrid"));
  eng.begin_step();
  float* dq = nullptr;
  CUDA_OK(cudaMalloc(&dq, f.q.size() * 4 * 2));
  EXPECT_THROW(eng.enqueue_layer(1, dq, dq + f.q.size(), nullptr), InvalidArgument) << "layer 0 comes first";
  eng.enqueue_layer(0, dq, dq + f.q.size(), nullptr);
  eng.enqueue_layer(1, dq, dq + f.q.size(), nullptr);
  EXPECT_THROW(eng.enqueue_layer(2, dq, dq + f.q.size(), nullptr), InvalidArgument) << "past the last layer";
  eng.synchronize();
  cudaFree(dq);
}

// Issue 9: between steps the route switches to published encoded pages and
// pages move between host and GPU. One engine updated through such switches
// (only the changed work entries rewritten, buffers grown as needed) gives
// the bits of a fresh engine given the same tables.
TEST(FormatRoutes, SwitchesBetweenStepsMatchAFreshEngine) {
  NEED_GPU();
  RouteFixture f;
  const std::unique_ptr<ResidentPages> rp = f.device_copies();
  struct Switch { const char* route; Placement place; };
  const std::vector<Switch> switches = {
      {"bf16", Placement::streamed},      {"hybrid", Placement::streamed}, {"int8s", Placement::streamed},
      {"int8s", Placement::mixed},        {"lossless13", Placement::mixed}, {"hybrid", Placement::resident},
      {"lossless13", Placement::streamed}, {"bf16", Placement::streamed},
  };
  for (int tile : {3, 0}) {
    DecodeEngine eng(f.config(tile));
    for (const Switch& sw : switches) {
      const std::vector<SeqPages> t = f.placed(sw.route, sw.place, rp.get());
      eng.update(t);
      const std::vector<float> got = f.steps(eng);
      DecodeEngine fresh(f.config(tile));
      fresh.update(t);
      EXPECT_TRUE(same_bits(got, f.steps(fresh)))
          << "switched to " << sw.route << " " << placement_name(sw.place) << ", tile_pages " << tile;
    }
  }
}

TEST(Lossless13Unpack, CorruptDirectoryGivesNaNNotAnOutOfBoundsRead) {
  NEED_GPU();
  const kv::KvShape ks{1, 2, 64, 64};
  kv::PageStore store(ks);
  kv::SequenceKv seq(store);
  fill_history(seq, ks, 64, 3);
  kv::EncodedPage e = kv::encode_page(kv::CodecFormat::lossless13, store, seq.page_table(0)[0], 64);
  const uint32_t bad = 0x7fffff00u;
  std::memcpy(e.bytes.data() + 64 + 4 * 1, &bad, 4);  // plane 1 (K of head 1) points far past the blob
  AttnShape sh{2, 1, 64, 64, 32, 0.f};
  void *src, *dst, *items;
  CUDA_OK(cudaMalloc(&src, e.bytes.size()));
  CUDA_OK(cudaMalloc(&dst, sh.page_bytes()));
  CUDA_OK(cudaMalloc(&items, sizeof(UnpackWork)));
  CUDA_OK(cudaMemcpy(src, e.bytes.data(), e.bytes.size(), cudaMemcpyHostToDevice));
  const UnpackWork w{src, dst, e.bytes.size()};
  CUDA_OK(cudaMemcpy(items, &w, sizeof w, cudaMemcpyHostToDevice));
  launch_unpack_lossless13(sh, static_cast<UnpackWork*>(items), 1, nullptr);
  std::vector<uint16_t> out(sh.page_bytes() / 2);
  CUDA_OK(cudaMemcpy(out.data(), dst, sh.page_bytes(), cudaMemcpyDeviceToHost));
  const size_t plane = 64 * 64;
  const auto* orig = reinterpret_cast<const uint16_t*>(store.k_plane(seq.page_table(0)[0], 0));
  EXPECT_EQ(0, std::memcmp(out.data(), orig, plane * 2)) << "plane 0 unpacks to the stored bits";
  for (size_t i = plane; i < 2 * plane; ++i) ASSERT_EQ(out[i], 0x7fc0) << "value " << i;
  EXPECT_EQ(0, std::memcmp(out.data() + 2 * plane, orig + 2 * plane, 2 * plane * 2)) << "V planes intact";
  // A header claiming more tokens than a page holds: every plane NaN, nothing stale.
  const uint32_t too_many = 65;
  CUDA_OK(cudaMemcpy(static_cast<std::byte*>(src) + 20, &too_many, 4, cudaMemcpyHostToDevice));
  launch_unpack_lossless13(sh, static_cast<UnpackWork*>(items), 1, nullptr);
  CUDA_OK(cudaMemcpy(out.data(), dst, sh.page_bytes(), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], 0x7fc0) << "value " << i;
  cudaFree(src); cudaFree(dst); cudaFree(items);
}

}  // namespace
}  // namespace activekv::cuda
