// GPU tests of Gemma 3 270M through the one runtime (issue 11 part 2):
// QK-norm, GeGLU, the four norms per block, the sqrt(d_model) embedding
// scale, the tied head, per-layer RoPE bases and the 15 sliding-window
// layers whose history lives only in GPU rings (src/runtime/sliding_ring.h),
// against the CPU reference path (itself checked against transformers:
// tests/model/gemma3_test.cpp). Labelled `gpu`; every test skips, saying so,
// without the model (scripts/setup.sh --gemma3).
//
// A failure says where the two paths part: the first test compares every
// stage of every layer (model::Stage: embedding, queries, attention output,
// layer output) in order and names the first that is off, before any logit
// is compared.
//
// Bounds: ~3x what each test measured on the H200 at af92df1 (the figures are
// beside each bound); every test prints its [measured] figures.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <utility>

#include "../model/gemma3_fixture.h"
#include "../model/model_fixture.h"
#include "activekv/model/sampler.h"
#include "activekv/runtime/gpu_runtime.h"
#include "activekv/tokenizer/tokenizer.h"
#include "gpu_test_util.h"

namespace activekv {
namespace {

constexpr int kPage = 64;

runtime::RuntimeOptions options(int64_t n_ctx, const std::string& route, route::KvPlacement placement) {
  runtime::RuntimeOptions o;
  o.n_ctx = n_ctx;
  o.page_size = kPage;  // the window (512) spans 8 pages: first visible pages cut mid-page
  o.route.kind = route::parse_kind(route);
  o.route.recent_pages = 2;
  o.route.tile_pages = 4;
  o.placement = placement;
  o.convert_threads = 0;  // conversion inside the step: the route is the same run to run
  o.prefill_chunk = 128;
  o.stream_chunk = 128;   // the rings hold window + 32 + 128 tokens: 12 pages of 64, so 1500 tokens wrap them
  o.sampling.temperature = 0.f;
  return o;
}

// `n` tokens of Pride and Prejudice in Gemma 3's tokenizer (BOS first).
std::vector<int32_t> prose_ids(size_t n) {
  std::ifstream in(std::string(ACTIVEKV_SOURCE_DIR) + "/data/texts/pride-and-prejudice.txt", std::ios::binary);
  if (!in) throw std::runtime_error("data/texts/pride-and-prejudice.txt missing");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  text.resize(std::min(text.size(), 10 * n));
  static const Tokenizer tok = Tokenizer::from_gguf(*testing::gemma3_file());  // 262,144 tokens: built once
  std::vector<int32_t> ids = tok.encode(text, true);
  if (ids.size() < n) throw std::runtime_error("the text gave too few tokens");
  ids.resize(n);
  return ids;
}

// ---- Stage by stage -------------------------------------------------------

using StageKey = std::pair<int, model::Stage>;  // (layer, stage); the embedding is layer -1
using Stages = std::map<StageKey, std::vector<float>>;

model::StageObserver recorder(Stages& out) {
  return [&out](int layer, model::Stage stage, int T, int width, const float* rows) {
    out[{layer, stage}].assign(rows, rows + size_t(T) * size_t(width));
  };
}

// max |gpu - cpu| / max |cpu| over a stage's values (its scale: Gemma's
// residual stream grows to hundreds, its queries are RMS-normalised).
double relative_error(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (!std::isfinite(gpu[i])) return INFINITY;
    err = std::max(err, double(std::abs(gpu[i] - cpu[i])));
    scale = std::max(scale, double(std::abs(cpu[i])));
  }
  return scale > 0 ? err / scale : err;
}

// One chunk of 96 tokens (prefill) and, after it, decode steps: each stage of
// each layer, GPU vs CPU, with fp32 activations on the GPU (the CPU's
// arithmetic in every projection), so that what remains is summation order,
// the prefill attention's bf16 terms and bf16 rounding flips of stored K/V.
// Bounds relative to the stage's largest value, ~3x what the H200 measured at
// af92df1 (bench/results/h200_device_tests_af92df1.log): the embedding is the
// CPU's dequantisation times the same fp32 scale (measured exact; 1e-6
// allowed); layer 0: queries 2.98e-7 (matvec summation order), attention
// 4.66e-5 (the 2-term prefill attention), output 9.8e-7; deeper layers, the
// worst over layers 1-17: queries 3.28e-3, attention 5.94e-3, output 4.18e-4.
TEST(GpuRuntimeGemma3, EveryStageOfEveryLayerFollowsTheCpuInOrder) {
  NEED_GPU();  // first: no model load (seconds) on a machine without a GPU
  GEMMA3_OR_SKIP(m);
  const std::vector<int32_t> ids = prose_ids(96);
  const model::ModelConfig& c = m->config();
  Stages cpu, gpu;
  {
    model::ForwardOptions fo = m->options();
    const model::ForwardOptions saved = fo;
    fo.on_stage = recorder(cpu);
    m->set_options(fo);
    kv::PageStore store(m->kv_shape(kPage));
    kv::SequenceKv seq(store);
    std::vector<float> logits(ids.size() * size_t(c.vocab_size));
    m->forward(ids, seq, logits, /*all_logits=*/true);
    m->set_options(saved);
  }
  runtime::RuntimeOptions o = options(int64_t(ids.size()), "exact", route::KvPlacement::host);
  o.f32_activations = true;
  o.observer = recorder(gpu);
  runtime::GpuRuntime rt(*testing::gemma3_file(), c, o);
  rt.prefill_logits(ids);
  ASSERT_EQ(gpu.size(), cpu.size()) << "the GPU reported " << gpu.size() << " stages, the CPU " << cpu.size();
  const std::pair<model::Stage, double> layer0[] = {
      {model::Stage::queries, 9e-7}, {model::Stage::attention, 1.4e-4}, {model::Stage::layer_output, 3e-6}};
  const std::pair<model::Stage, double> deeper[] = {
      {model::Stage::queries, 1e-2}, {model::Stage::attention, 1.8e-2}, {model::Stage::layer_output, 1.3e-3}};
  auto check = [&](int layer, model::Stage stage, double bound) {
    const auto& g = gpu.at({layer, stage});
    const auto& r = cpu.at({layer, stage});
    if (g.size() != r.size()) return ::testing::AssertionFailure() << "size " << g.size() << " vs " << r.size();
    const double e = relative_error(g, r);
    std::printf("[measured] layer %2d %-12s max |GPU - CPU| / max |CPU| = %.3e (bound %.0e)\n", layer,
                model::stage_name(stage), e, bound);
    if (e <= bound) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "layer " << layer << " (" << (c.layer_attention[size_t(std::max(layer, 0))].sliding() ? "sliding" : "global")
                                         << "), stage " << model::stage_name(stage) << ": relative error " << e
                                         << " > " << bound << " -- the first place GPU and CPU part";
  };
  ASSERT_TRUE(check(-1, model::Stage::embedding, 1e-6));
  for (const auto& [stage, bound] : layer0) ASSERT_TRUE(check(0, stage, bound));
  for (int l = 1; l < c.n_layers; ++l)
    for (const auto& [stage, bound] : deeper) ASSERT_TRUE(check(l, stage, bound));
}

// ---- Logits over a prompt longer than the window ---------------------------

// CPU reference logits of every position (bf16 history, as the GPU stores
// it), in chunks of 128 as the GPU runs them.
std::vector<float> cpu_logits(model::LlamaModel& m, const std::vector<int32_t>& ids) {
  kv::PageStore store(m.kv_shape(kPage));
  kv::SequenceKv seq(store);
  const size_t vocab = size_t(m.config().vocab_size);
  std::vector<float> out(ids.size() * vocab);
  for (size_t i = 0; i < ids.size(); i += 128) {
    const size_t n = std::min<size_t>(128, ids.size() - i);
    m.forward(std::span<const int32_t>(ids).subspan(i, n), seq, std::span<float>(out).subspan(i * vocab), true);
  }
  return out;
}

struct LogitComparison {
  double max_delta[3] = {0, 0, 0};  // positions < 512, [512, ring wrap), >= ring wrap
  size_t agree = 0;
};

// Ranges: before the window cuts (< 512), the window cutting (the sliding
// layers no longer see position 0), and after the rings wrapped (their
// oldest pages overwritten: 12 pages of 64 = 768 tokens).
constexpr size_t kWindowStarts = 512, kRingWraps = 768;

LogitComparison compare_logits(const std::vector<float>& gpu, const std::vector<float>& cpu, size_t vocab,
                               const char* what) {
  LogitComparison r;
  const size_t n = cpu.size() / vocab;
  for (size_t p = 0; p < n; ++p) {
    const std::span<const float> g(gpu.data() + p * vocab, vocab), c(cpu.data() + p * vocab, vocab);
    const int range = p < kWindowStarts ? 0 : p < kRingWraps ? 1 : 2;
    for (size_t v = 0; v < vocab; ++v) {
      EXPECT_TRUE(std::isfinite(g[v])) << what << ": position " << p << " logit " << v;
      if (!std::isfinite(g[v])) return r;
      r.max_delta[range] = std::max(r.max_delta[range], double(std::abs(g[v] - c[v])));
    }
    r.agree += model::argmax(g) == model::argmax(c);
  }
  std::printf("[measured] gemma3 %s, %zu positions: max |dlogit| %.4f (< 512), %.4f (512..767), %.4f (ring "
              "wrapped, >= 768); argmax agreement %zu/%zu\n",
              what, n, r.max_delta[0], r.max_delta[1], r.max_delta[2], r.agree, n);
  return r;
}

// 1,500 tokens in chunks of 128 with pages of 64: the window (512) cuts from
// position 512 on and the rings (12 pages) wrap from 768 on. Measured on the
// H200 at af92df1: fp32 activations 0.1235 logits at worst (after the wrap),
// int8/bf16 activations 0.5852 (while the window cuts); argmax agreement
// 1498 and 1486 of 1500. Bounds ~3x: 0.37 and 1.8. For scale: a GPU that
// ignored the window would differ by ~21 logits at positions >= 512 (what
// transformers without its window differs by: docs/gemma3.md).
class GpuRuntimeGemma3Logits : public ::testing::TestWithParam<bool> {};

TEST_P(GpuRuntimeGemma3Logits, FollowTheCpuBeforeAndAfterTheWindowAndTheRingWrap) {
  NEED_GPU();
  GEMMA3_OR_SKIP(m);
  const bool f32 = GetParam();
  const std::vector<int32_t> ids = prose_ids(1500);
  runtime::RuntimeOptions o = options(int64_t(ids.size()), "exact", route::KvPlacement::host);
  o.f32_activations = f32;
  runtime::GpuRuntime rt(*testing::gemma3_file(), m->config(), o);
  EXPECT_EQ(rt.stats().sliding_layers, 15);
  EXPECT_EQ(rt.stats().window, 512);
  const std::vector<float> gpu = rt.prefill_logits(ids);
  static const std::vector<float> cpu = cpu_logits(*m, ids);  // the same for both parameters
  const LogitComparison r = compare_logits(gpu, cpu, size_t(m->config().vocab_size),
                                           f32 ? "fp32 activations" : "int8/bf16 activations");
  const double bound = f32 ? 0.37 : 1.8;
  EXPECT_LE(r.max_delta[0], bound) << "before the window cuts";
  EXPECT_LE(r.max_delta[1], bound) << "the window cutting (sliding layers past position 0)";
  EXPECT_LE(r.max_delta[2], bound) << "after the rings wrapped";
  EXPECT_GE(double(r.agree) / double(ids.size()), 0.97);
}

INSTANTIATE_TEST_SUITE_P(Activations, GpuRuntimeGemma3Logits, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "f32" : "int8"; });

// ---- Decode ----------------------------------------------------------------

// The 1,500-token prompt, then greedy decode steps on the CPU and the GPU:
// with fp32 activations the tokens are the CPU's (llama's f32 path: 64 of 64
// on the H200); the logits of each step within the bound above.
TEST(GpuRuntimeGemma3, GreedyDecodeAfterTheRingWrappedIsTheCpuPath) {
  NEED_GPU();
  GEMMA3_OR_SKIP(m);
  const std::vector<int32_t> prompt = prose_ids(1500);
  const int n = 32;
  std::vector<int32_t> cpu;
  std::vector<std::vector<float>> cpu_step_logits;
  {
    kv::PageStore store(m->kv_shape(kPage));
    kv::SequenceKv seq(store);
    std::vector<float> logits = m->prefill(prompt, seq);
    for (int i = 0; i < n; ++i) {
      cpu.push_back(model::argmax(logits));
      const int32_t one[1] = {cpu.back()};
      m->forward(one, seq, logits);
      cpu_step_logits.push_back(logits);
    }
  }
  runtime::RuntimeOptions o = options(int64_t(prompt.size()) + n, "exact", route::KvPlacement::host);
  o.f32_activations = true;
  runtime::GpuRuntime rt(*testing::gemma3_file(), m->config(), o);
  std::vector<int32_t> gpu{rt.prefill(prompt)};
  double max_delta = 0;
  while (int(gpu.size()) < n) {
    gpu.push_back(rt.decode(gpu.back()));
    const std::vector<float> l = rt.last_logits();
    const std::vector<float>& r = cpu_step_logits[gpu.size() - 2];
    if (gpu[gpu.size() - 2] != cpu[gpu.size() - 2]) break;  // different inputs from here on
    for (size_t v = 0; v < l.size(); ++v) max_delta = std::max(max_delta, double(std::abs(l[v] - r[v])));
  }
  int same = 0;
  while (same < int(gpu.size()) && gpu[size_t(same)] == cpu[size_t(same)]) ++same;
  std::printf("[measured] gemma3 f32 activations: greedy GPU vs CPU, first %d of %d tokens identical; decode "
              "logits max |dlogit| %.4f\n", same, n, max_delta);
  EXPECT_EQ(gpu, cpu);
  EXPECT_LE(max_delta, 0.15);  // measured 0.0478 on the H200 at af92df1 (32 of 32 tokens equal)
  // The decode steps streamed only the global layers' pages: 3 layers' full
  // pages each step (the tail page is on the GPU), never a sliding layer's.
  const runtime::RuntimeStats& st = rt.stats();
  const size_t page_bytes = size_t(2) * m->config().n_kv_heads * kPage * m->config().head_dim * 2;
  size_t expected = 0;
  for (int64_t t = int64_t(prompt.size()) + 1; t < int64_t(prompt.size()) + n; ++t)
    expected += size_t(3) * size_t((t + kPage - 1) / kPage - 1) * page_bytes;
  EXPECT_EQ(st.streamed_bytes, expected) << "streamed bytes are not 3 global layers' full pages per step";
  // The sliding layers read at most their window plus the rest of its first
  // and the tail page: [window, window + page] tokens a layer a step.
  const size_t token_bytes = page_bytes / kPage;
  EXPECT_GE(st.sliding_bytes, st.decode_steps * 15 * 512 * token_bytes);
  EXPECT_LE(st.sliding_bytes, st.decode_steps * 15 * (512 + kPage) * token_bytes);
}

// ---- Placements and routes --------------------------------------------------

struct DecodeRun {
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> tokens;
  runtime::RuntimeStats stats;
};

DecodeRun decode_run(const std::string& route, route::KvPlacement placement, int steps) {
  const std::vector<int32_t> prompt = prose_ids(900);  // past the ring wrap (768)
  runtime::GpuRuntime rt(*testing::gemma3_file(), testing::gemma3()->config(),
                         options(int64_t(prompt.size()) + steps + 1, route, placement));
  DecodeRun r;
  r.tokens.push_back(rt.prefill(prompt));
  for (int i = 0; i < steps; ++i) {
    r.tokens.push_back(rt.decode(r.tokens.back()));
    r.logits.push_back(rt.last_logits());
  }
  r.stats = rt.stats();
  return r;
}

class GpuRuntimeGemma3Placement : public ::testing::TestWithParam<std::string> {};

// SPEC §4 on Gemma: the global layers' pages streamed (host) or resident
// (gpu) give the same bits, with the sliding layers' rings in both; the
// compressed routes convert and read only global layers' pages.
TEST_P(GpuRuntimeGemma3Placement, HostAndGpuPlacementGiveTheSameBits) {
  NEED_GPU();
  GEMMA3_OR_SKIP(m);
  const int steps = 40;  // 901 + 40 crosses the page boundary at 960
  const DecodeRun host = decode_run(GetParam(), route::KvPlacement::host, steps);
  const DecodeRun gpu = decode_run(GetParam(), route::KvPlacement::gpu, steps);
  EXPECT_EQ(host.stats.placement.placement, route::KvPlacement::host);
  EXPECT_EQ(gpu.stats.placement.placement, route::KvPlacement::gpu);
  EXPECT_GT(host.stats.streamed_bytes, 0u);
  EXPECT_EQ(gpu.stats.streamed_bytes, 0u);
  EXPECT_EQ(host.stats.sliding_bytes, gpu.stats.sliding_bytes);
  if (GetParam() != "exact")
    EXPECT_GT(host.stats.pages.pages[size_t(route::compressed_format(route::parse_kind(GetParam())))], 0u)
        << "the route read no compressed page";
  ASSERT_EQ(host.logits.size(), gpu.logits.size());
  for (size_t i = 0; i < host.logits.size(); ++i)
    ASSERT_EQ(0, std::memcmp(host.logits[i].data(), gpu.logits[i].data(), host.logits[i].size() * sizeof(float)))
        << GetParam() << ": step " << i << " differs between host and gpu placement";
  EXPECT_EQ(host.tokens, gpu.tokens);
  std::printf("[measured] gemma3 %s: %d steps bitwise equal; host streamed %.2f MiB/step (3 global layers), "
              "sliding layers read %.2f MiB/step from their rings\n",
              GetParam().c_str(), steps, double(host.stats.streamed_bytes) / steps / (1 << 20),
              double(host.stats.sliding_bytes) / steps / (1 << 20));
}

INSTANTIATE_TEST_SUITE_P(Routes, GpuRuntimeGemma3Placement, ::testing::Values("exact", "lossless13", "int8s", "hybrid"));

}  // namespace
}  // namespace activekv
