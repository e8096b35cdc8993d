// qwen2 through the GPU runtime (activekv/runtime/gpu_runtime.h): the tiny
// random model of tools/make_tiny_qwen2.py (Q/K/V biases, NEOX RoPE, GQA
// group 2, head dim 64, untied head, F32 weights), committed in
// tests/fixtures/qwen2. Prefill logits against the CPU reference (bf16
// pages, as the GPU stores them) and against transformers' golden; decode
// logits step by step against the CPU; a 16-token greedy decode against the
// CPU's, for both placements. Labelled `gpu`; needs nothing installed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "../model/qwen2_fixture.h"
#include "activekv/model/sampler.h"
#include "activekv/route/prefill_plan.h"
#include "activekv/runtime/gpu_runtime.h"
#include "device_array.h"

namespace activekv {
namespace {

#define NEED_GPU() \
  if (!cuda::testing::have_gpu()) GTEST_SKIP() << "no CUDA device"

// Bound on |GPU - CPU| logits: measured on the H200 at 8dd1acf 0.130 over
// the prefill and 0.060 over decode (bench/results/h200_device_runtime_tests.log);
// asserted at 0.3, ~2.3x the larger (the error analysis below gives the same
// order, so 3x would exceed what it can explain). The prefill GEMMs
// round activations and weights to bf16: |dY| <= 2^-8 * sum_c |W[r][c] X[c]|
// (weight_gemm.h). For the head (128 inputs of RMS ~1, weights of RMS
// 4/sqrt(128)) that sum is ~29, so up to 0.11 per logit, and the errors the
// six GEMMs of each of the 2 layers pass on are of the same order: 0.3 in
// all. The pages are bf16 on both sides; K/V computed by bf16 GEMMs can flip
// a page rounding the CPU makes the other way, a smaller term. Decode
// matvecs on F32 weights are fp32 FMA: only the history inherited from the
// prefill and fp32 summation order differ there.
constexpr double kGpuCpuBound = 0.3;
// The CPU's bf16-page logits are within 0.043 of transformers (measured,
// tests/model/qwen2_test.cpp, bound 0.13 there).
constexpr double kCpuTransformersBound = 0.13;

constexpr int kPage = 16;   // the 40-token window spans 3 pages, the greedy run 3
constexpr int kChunk = 12;  // chunks that end mid-page

runtime::RuntimeOptions options(int64_t n_ctx, route::KvPlacement placement) {
  runtime::RuntimeOptions o;
  o.n_ctx = n_ctx;
  o.page_size = kPage;
  o.route.kind = route::RouteKind::exact;
  o.route.tile_pages = 2; // several streamed jobs per layer
  o.placement = placement;
  o.convert_threads = 0;
  o.prefill_chunk = kChunk;
  o.sampling.temperature = 0.f;
  return o;
}

struct Delta {
  double max = 0;
  size_t argmax_agree = 0, positions = 0;
  size_t clear_disagree = 0;  // argmax differs where the reference's top1-top2 gap > 2 x bound
};

/// `got` vs `ref`, both [n][vocab]; fails on any non-finite GPU logit.
Delta compare(const std::vector<float>& got, const std::vector<float>& ref, size_t vocab, double bound) {
  EXPECT_EQ(got.size(), ref.size());
  Delta d;
  d.positions = std::min(got.size(), ref.size()) / vocab;
  for (size_t p = 0; p < d.positions; ++p) {
    const std::span<const float> g(got.data() + p * vocab, vocab), r(ref.data() + p * vocab, vocab);
    for (size_t v = 0; v < vocab; ++v) {
      EXPECT_TRUE(std::isfinite(g[v])) << "position " << p << " logit " << v;
      d.max = std::max(d.max, double(std::abs(g[v] - r[v])));
    }
    const int32_t a = model::argmax(g), b = model::argmax(r);
    if (a == b) {
      ++d.argmax_agree;
      continue;
    }
    std::vector<float> rest(r.begin(), r.end());
    rest[size_t(b)] = -INFINITY;
    const double gap = double(r[size_t(b)]) - double(rest[size_t(model::argmax(rest))]);
    std::printf("  position %zu: argmax %d, reference %d (reference top1-top2 gap %.4f)\n", p, a, b, gap);
    if (gap > 2 * bound) ++d.clear_disagree;
  }
  return d;
}

std::vector<float> golden_logits() {
  std::vector<float> out;
  for (const auto& row : testing::qwen2_golden()["logits"])
    for (double v : row.get<std::vector<double>>()) out.push_back(float(v));
  return out;
}

TEST(GpuRuntimeQwen2, PrefillLogitsFollowTheCpuAndTransformers) {
  NEED_GPU();
  const std::vector<int32_t> ids = testing::qwen2_golden()["token_ids"].get<std::vector<int32_t>>();
  model::LlamaModel& m = testing::qwen2_model();
  const size_t vocab = size_t(m.config().vocab_size);
  runtime::GpuRuntime rt(testing::qwen2_file(), m.config(), options(int64_t(ids.size()), route::KvPlacement::host));
  const std::vector<float> gpu = rt.prefill_logits(ids);
  ASSERT_EQ(gpu.size(), ids.size() * vocab);
  EXPECT_EQ(rt.n_tokens(), int64_t(ids.size()));

  const Delta cpu = compare(gpu, testing::all_position_logits(m, ids, 16, kv::PageFormat::bf16), vocab, kGpuCpuBound);
  std::printf("[measured] qwen2 GPU prefill vs CPU (bf16 pages), %zu positions: max |dlogit| %.4f, argmax %zu/%zu\n",
              cpu.positions, cpu.max, cpu.argmax_agree, cpu.positions);
  EXPECT_LE(cpu.max, kGpuCpuBound);
  EXPECT_EQ(cpu.clear_disagree, 0u) << "argmax differs where the CPU's top1-top2 gap exceeds 2 x the bound";

  const double bound = kGpuCpuBound + kCpuTransformersBound;
  const Delta tf = compare(gpu, golden_logits(), vocab, bound);
  std::printf("[measured] qwen2 GPU prefill vs transformers fp32, %zu positions: max |dlogit| %.4f, argmax %zu/%zu\n",
              tf.positions, tf.max, tf.argmax_agree, tf.positions);
  EXPECT_LE(tf.max, bound);
  EXPECT_EQ(tf.clear_disagree, 0u) << "argmax differs where transformers' top1-top2 gap exceeds 2 x the bound";
}

// A streamed prefill (issue 9, item 6) on qwen2 (biases, group 2): the
// golden's 40 tokens three times over (120 tokens, 8 pages of 16) prefilled
// with the history resident and streamed through staging buffers of 1 and 3
// pages (the history of a chunk: up to 6 pages, so 1..6 segments merged by
// LSE). With 2 layers, two whole-layer buffers cost as much as keeping the
// prompt resident, so the bitwise whole-layer case is SmolLM2's
// (test_runtime.cpp). Bound, derived (the lead measures it): two cuttings of
// the keys differ by ~1.5e-5 relative in O (split vs unsplit,
// test_prefill.cpp, H200); this model's logits moved 0.13 for bf16 GEMM
// rounding of ~2e-3 relative (kGpuCpuBound's note): ~65 per unit, so ~0.001
// -- the H200 measured 0.0275 (see the bound below).
TEST(GpuRuntimeQwen2, StreamedPrefillFollowsTheResidentOne) {
  NEED_GPU();
  const std::vector<int32_t> golden = testing::qwen2_golden()["token_ids"].get<std::vector<int32_t>>();
  std::vector<int32_t> ids;
  for (int i = 0; i < 3; ++i) ids.insert(ids.end(), golden.begin(), golden.end());
  const model::ModelConfig& c = testing::qwen2_model().config();
  const size_t page_bytes = size_t(2) * c.n_kv_heads * kPage * c.head_dim * 2;
  // Each layer's decode tail page and the pages a chunk can touch.
  const size_t fixed = size_t(c.n_layers) * size_t(1 + route::pages_spanned(kChunk, kPage));
  auto run = [&](size_t budget_pages, int64_t staging) {
    runtime::RuntimeOptions o = options(int64_t(ids.size()), route::KvPlacement::host);
    o.stream_chunk = o.prefill_chunk;
    o.gpu_kv_mem = budget_pages * page_bytes;
    runtime::GpuRuntime rt(testing::qwen2_file(), c, o);
    std::vector<float> logits = rt.prefill_logits(ids);
    EXPECT_EQ(rt.stats().prefill_streamed, staging > 0);
    EXPECT_EQ(rt.stats().prefill_staging_pages, staging);
    return logits;
  };
  const std::vector<float> resident = run(0, 0);
  for (int64_t staging : {1, 3}) {
    const std::vector<float> streamed = run(fixed + 2 * size_t(staging), staging);
    ASSERT_EQ(resident.size(), streamed.size());
    double max_delta = 0;
    for (size_t i = 0; i < resident.size(); ++i)
      max_delta = std::max(max_delta, double(std::abs(resident[i] - streamed[i])));
    std::printf("[measured] qwen2 streamed prefill, staging 2 x %lld pages, vs resident: max |dlogit| %.3g\n",
                (long long)staging, max_delta);
    // Measured on the H200 at 486ee2a: 0.0275 for staging 1 and 3 (the bound
    // derived before, 0.01, was too tight: see kSegmentedBound in
    // test_runtime.cpp for why a merge's 1e-5 grows); asserted at ~3x.
    EXPECT_LE(max_delta, 0.083);
  }
}

/// The CPU's greedy tokens and each decode step's logits (bf16 pages).
struct CpuRun {
  std::vector<int32_t> tokens;             // tokens[0] from the prompt's last logits
  std::vector<std::vector<float>> logits;  // logits[i]: after feeding tokens[i]
};
CpuRun cpu_greedy(const std::vector<int32_t>& prompt, int n) {
  model::LlamaModel& m = testing::qwen2_model();
  kv::PageStore store(m.kv_shape(16));
  kv::SequenceKv seq(store);
  CpuRun r;
  std::vector<float> logits = m.prefill(prompt, seq);
  r.tokens.push_back(model::argmax(logits));
  while (int(r.tokens.size()) < n) {
    const int32_t one[1] = {r.tokens.back()};
    m.forward(one, seq, logits);
    r.logits.push_back(logits);
    r.tokens.push_back(model::argmax(logits));
  }
  return r;
}

class GpuRuntimeQwen2Greedy : public ::testing::TestWithParam<route::KvPlacement> {};

// 16 greedy tokens (temperature 0) after the golden's 24-token prompt, whose
// transformers path has every top1-top2 gap >= 0.39 (> 2 x kGpuCpuBound):
// identical to the CPU's. Each step feeds the CPU's token, so while the two
// agree this is the free-running greedy decode, and after a difference the
// later steps still compare like with like; each step's logits must be
// within kGpuCpuBound of the CPU's.
TEST_P(GpuRuntimeQwen2Greedy, SixteenTokensEqualTheCpu) {
  NEED_GPU();
  const int n = 16;
  const auto prompt = testing::qwen2_golden()["greedy"]["prompt_ids"].get<std::vector<int32_t>>();
  const CpuRun cpu = cpu_greedy(prompt, n);
  ASSERT_EQ(cpu.tokens, testing::qwen2_golden()["greedy"]["continuation_ids"].get<std::vector<int32_t>>())
      << "the CPU reference itself left transformers' path";

  runtime::GpuRuntime rt(testing::qwen2_file(), testing::qwen2_model().config(),
                         options(int64_t(prompt.size()) + n, GetParam()));
  const size_t vocab = size_t(rt.config().vocab_size);
  std::vector<int32_t> gpu{rt.prefill(prompt)};
  double step_delta = 0;
  size_t step_agree = 0;
  for (int i = 0; i + 1 < n; ++i) {
    const int32_t next = rt.decode(cpu.tokens[size_t(i)]);  // the CPU's token: both histories stay the same
    gpu.push_back(next);
    const Delta d = compare(rt.last_logits(), cpu.logits[size_t(i)], vocab, kGpuCpuBound);
    step_delta = std::max(step_delta, d.max);
    step_agree += d.argmax_agree;
  }
  int first_diff = -1;
  for (int i = 0; i < n && first_diff < 0; ++i)
    if (gpu[size_t(i)] != cpu.tokens[size_t(i)]) first_diff = i;
  const std::string where = route::placement_name(GetParam());
  std::printf("[measured] qwen2 %s placement: decode logits vs CPU max |dlogit| %.4f over %d steps (argmax %zu/%d); "
              "greedy %s (first difference at token %d)\n",
              where.c_str(), step_delta, n - 1, step_agree, n - 1, first_diff < 0 ? "identical" : "different",
              first_diff);
  EXPECT_LE(step_delta, kGpuCpuBound);
  EXPECT_EQ(gpu, cpu.tokens) << "first difference at token " << first_diff;
  EXPECT_EQ(rt.stats().placement.placement, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Placements, GpuRuntimeQwen2Greedy,
                         ::testing::Values(route::KvPlacement::host, route::KvPlacement::gpu),
                         [](const auto& info) { return route::placement_name(info.param); });

// Only the global layers' history lives in host pages: a model without one
// has nothing to page and is refused in one line before any GPU work (the
// tiny qwen2 file with every layer given a window).
TEST(GpuRuntimeSliding, AModelWithoutAGlobalLayerIsRefusedInOneLine) {
  model::ModelConfig c = testing::qwen2_model().config();
  for (model::LayerAttention& a : c.layer_attention) a.window = 4;
  c.sliding_window = 4;
  try {
    runtime::GpuRuntime rt(testing::qwen2_file(), c, options(8, route::KvPlacement::host));
    ADD_FAILURE() << "expected activekv::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "the GPU runtime needs a layer that attends the whole history; this model's are " + c.layer_split());
  }
}

}  // namespace
}  // namespace activekv
