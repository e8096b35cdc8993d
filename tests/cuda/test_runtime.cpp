// GPU tests of the one runtime (activekv/runtime/gpu_runtime.h) on the real
// default model (SmolLM2-135M-Instruct Q4_1): GPU logits against the CPU
// reference, greedy tokens against the CPU path, streamed (host placement)
// against resident (gpu placement) bitwise for every format, and bad input.
// Labelled `gpu`; needs the model (scripts/setup.sh; on the GPU machine
// scripts/device_run.sh joins the carried parts).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include "../model/model_fixture.h"
#include "activekv/model/sampler.h"
#include "activekv/route/prefill_plan.h"
#include "activekv/cuda/launch.h"
#include "activekv/runtime/gpu_runtime.h"
#include "activekv/tokenizer/tokenizer.h"
#include "device_array.h"

namespace activekv {
namespace {

#define NEED_GPU() \
  if (!cuda::testing::have_gpu()) GTEST_SKIP() << "no CUDA device"

runtime::RuntimeOptions options(int64_t n_ctx, const std::string& route, route::KvPlacement placement) {
  runtime::RuntimeOptions o;
  o.n_ctx = n_ctx;
  o.page_size = 64;  // several pages in a few hundred tokens (int8s needs full pages, multiples of 16)
  o.route.kind = route::parse_kind(route);
  o.route.recent_pages = 2;
  o.route.tile_pages = 4;  // several streamed jobs per layer
  o.placement = placement;
  o.convert_threads = 0;  // conversion inside the step: the route is the same run to run
  o.prefill_chunk = 96;   // several chunks, one ending mid-page
  o.sampling.temperature = 0.f;
  return o;
}

std::vector<int32_t> golden_ids() {
  return testing::load_golden("smollm2_logits.json")["token_ids"].get<std::vector<int32_t>>();
}

// CPU reference logits of every position (bf16 history, as the GPU stores it).
std::vector<float> cpu_logits(const std::vector<int32_t>& ids) {
  model::LlamaModel& m = testing::shared_model();
  kv::PageStore store(m.kv_shape(64));
  kv::SequenceKv seq(store);
  std::vector<float> out(ids.size() * size_t(m.config().vocab_size));
  m.forward(ids, seq, out, /*all_logits=*/true);
  return out;
}

TEST(GpuRuntime, LogitsFollowTheCpuReferenceOnRealProse) {
  NEED_GPU();
  const std::vector<int32_t> ids = golden_ids();
  const model::ModelConfig& c = testing::shared_model().config();
  runtime::GpuRuntime rt(testing::model_file(), c, options(int64_t(ids.size()), "exact", route::KvPlacement::host));
  const std::vector<float> gpu = rt.prefill_logits(ids);
  const std::vector<float> cpu = cpu_logits(ids);
  const size_t vocab = size_t(c.vocab_size);
  double max_delta = 0;
  size_t agree = 0;
  for (size_t p = 0; p < ids.size(); ++p) {
    const std::span<const float> g(gpu.data() + p * vocab, vocab), r(cpu.data() + p * vocab, vocab);
    for (size_t v = 0; v < vocab; ++v) {
      ASSERT_TRUE(std::isfinite(g[v])) << "position " << p << " logit " << v;
      max_delta = std::max(max_delta, double(std::abs(g[v] - r[v])));
    }
    agree += model::argmax(g) == model::argmax(r);
  }
  std::printf("[measured] GPU vs CPU logits, %zu positions: max |dlogit| %.4f, argmax agreement %zu/%zu\n", ids.size(),
              max_delta, agree, ids.size());
  // Measured on the H200 at 8dd1acf, 5be5c54, 28a2dd8, 21f39c4 and 9fd7f34 (bench/results/h200_device_runtime_tests.log):
  // max |dlogit| 0.622, argmax 297/300. The prefill GEMMs take bf16
  // activations and weights (2^-9 relative per operand) where the CPU keeps
  // fp32; asserted at ~3x: 1.9, and at most 3x the 1 % disagreement.
  EXPECT_LE(max_delta, 1.9);
  EXPECT_GE(double(agree) / double(ids.size()), 0.97);
}

// The GPU decodes with int8 activations in its matvecs (the CPU in fp32), so
// greedy tokens agree until the CPU's choice is a near tie: measured on the
// H200 at 8dd1acf, the first 53 of 64 tokens are identical. The test holds
// the GPU to that: every token until the first difference is the CPU's, the
// first difference comes only where the CPU's top-2 logits are within the
// measured logit error (0.62, asserted 1.9 above), and not before token 16.
TEST(GpuRuntime, GreedyDecodeFollowsTheCpuPathUntilANearTie) {
  NEED_GPU();
  const auto g = testing::load_golden("smollm2_logits.json")["greedy"];
  const auto prompt = g["prompt_ids"].get<std::vector<int32_t>>();
  const int n = 64;
  model::LlamaModel& m = testing::shared_model();
  std::vector<int32_t> cpu;
  std::vector<std::vector<float>> cpu_logits;
  {
    kv::PageStore store(m.kv_shape(64));
    kv::SequenceKv seq(store);
    std::vector<float> logits = m.prefill(prompt, seq);
    for (int i = 0; i < n; ++i) {
      cpu.push_back(model::argmax(logits));
      cpu_logits.push_back(logits);
      const int32_t one[1] = {cpu.back()};
      m.forward(one, seq, logits);
    }
  }
  runtime::GpuRuntime rt(testing::model_file(), m.config(),
                         options(int64_t(prompt.size()) + n, "exact", route::KvPlacement::host));
  std::vector<int32_t> gpu{rt.prefill(prompt)};
  while (int(gpu.size()) < n) gpu.push_back(rt.decode(gpu.back()));
  int first_diff = -1;
  for (int i = 0; i < n && first_diff < 0; ++i)
    if (gpu[size_t(i)] != cpu[size_t(i)]) first_diff = i;
  std::printf("[measured] greedy GPU vs CPU: %s (first difference at token %d of %d)\n",
              first_diff < 0 ? "identical" : "different", first_diff, n);
  if (first_diff < 0) return;
  const std::vector<float>& l = cpu_logits[size_t(first_diff)];
  const double gap = double(l[size_t(cpu[size_t(first_diff)])]) - double(l[size_t(gpu[size_t(first_diff)])]);
  std::printf("[measured] at that token the CPU prefers its choice by %.4f logits\n", gap);
  EXPECT_GE(first_diff, 16);
  EXPECT_LE(gap, 1.9) << "the GPU left the CPU's path where the CPU's choice was clear";
}

// With fp32 activations (RuntimeOptions::f32_activations: the CPU path's
// arithmetic in every projection) the GPU differs from the CPU only in
// summation order, bf16 terms of prefill attention and transcendental
// functions: the logits stay close and the 64 greedy tokens are the CPU's.
TEST(GpuRuntime, F32ActivationsLogitsAndGreedyTokensAreTheCpuPaths) {
  NEED_GPU();
  model::LlamaModel& m = testing::shared_model();
  const std::vector<int32_t> ids = golden_ids();
  runtime::RuntimeOptions o = options(int64_t(ids.size()), "exact", route::KvPlacement::host);
  o.f32_activations = true;
  double max_delta = 0;
  {
    runtime::GpuRuntime rt(testing::model_file(), m.config(), o);
    const std::vector<float> gpu = rt.prefill_logits(ids);
    const std::vector<float> cpu = cpu_logits(ids);
    for (size_t i = 0; i < gpu.size(); ++i) max_delta = std::max(max_delta, double(std::abs(gpu[i] - cpu[i])));
  }
  std::printf("[measured] f32 activations: GPU vs CPU logits over %zu positions, max |dlogit| %.5f\n", ids.size(),
              max_delta);
  // Measured on the H200 at 486ee2a: 0.101 (the int8/bf16 path: 0.62); the 64
  // greedy tokens identical. Asserted at ~3x.
  EXPECT_LE(max_delta, 0.3);

  const auto g = testing::load_golden("smollm2_logits.json")["greedy"];
  const auto prompt = g["prompt_ids"].get<std::vector<int32_t>>();
  const int n = 64;
  std::vector<int32_t> cpu;
  {
    kv::PageStore store(m.kv_shape(64));
    kv::SequenceKv seq(store);
    std::vector<float> logits = m.prefill(prompt, seq);
    for (int i = 0; i < n; ++i) {
      cpu.push_back(model::argmax(logits));
      const int32_t one[1] = {cpu.back()};
      m.forward(one, seq, logits);
    }
  }
  runtime::RuntimeOptions og = options(int64_t(prompt.size()) + n, "exact", route::KvPlacement::host);
  og.f32_activations = true;
  runtime::GpuRuntime rt(testing::model_file(), m.config(), og);
  std::vector<int32_t> gpu{rt.prefill(prompt)};
  while (int(gpu.size()) < n) gpu.push_back(rt.decode(gpu.back()));
  int same = 0;
  while (same < n && gpu[size_t(same)] == cpu[size_t(same)]) ++same;
  std::printf("[measured] f32 activations: greedy GPU vs CPU, first %d of %d tokens identical\n", same, n);
  EXPECT_EQ(gpu, cpu);
}

// Decode logits of `steps` greedy steps after the prompt, with the history
// streamed (host) or resident (gpu), along `route`.
struct DecodeRun {
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> tokens;
  runtime::RuntimeStats stats;
};
DecodeRun decode_run(const std::string& route, route::KvPlacement placement, int steps, bool cuda_graphs = false,
                     double cpu_share = 0, const std::vector<int32_t>* forced = nullptr, size_t gpu_kv_mem = 0) {
  const std::vector<int32_t> ids = golden_ids();
  const std::vector<int32_t> prompt(ids.begin(), ids.begin() + 280);  // 4 full pages and a tail
  runtime::RuntimeOptions o = options(int64_t(prompt.size()) + steps + 1, route, placement);
  o.cuda_graphs = cuda_graphs;
  o.cpu_share = cpu_share;
  o.gpu_kv_mem = gpu_kv_mem;
  runtime::GpuRuntime rt(testing::model_file(), testing::shared_model().config(), o);
  DecodeRun r;
  r.tokens.push_back(rt.prefill(prompt));
  for (int i = 0; i < steps; ++i) {
    // Teacher forcing (`forced`): step i reads token i of another run, so the
    // histories stay the same even where a near tie flips a greedy choice.
    r.tokens.push_back(rt.decode(forced ? forced->at(size_t(i)) : r.tokens.back()));
    r.logits.push_back(rt.last_logits());
  }
  r.stats = rt.stats();
  return r;
}

class PlacementExactness : public ::testing::TestWithParam<std::string> {};

// SPEC §4: streamed == resident bitwise, and repeatable, for every route on
// the real model (the engine reads the same bytes with the same kernels and
// split boundaries wherever a page lies).
TEST_P(PlacementExactness, HostAndGpuPlacementGiveTheSameBits) {
  NEED_GPU();
  const int steps = 40;  // crosses a page boundary (280 + 40 > 320)
  const DecodeRun host = decode_run(GetParam(), route::KvPlacement::host, steps);
  const DecodeRun gpu = decode_run(GetParam(), route::KvPlacement::gpu, steps);
  const DecodeRun again = decode_run(GetParam(), route::KvPlacement::host, steps);
  EXPECT_EQ(host.stats.placement.placement, route::KvPlacement::host);
  EXPECT_EQ(gpu.stats.placement.placement, route::KvPlacement::gpu);
  EXPECT_GT(host.stats.streamed_bytes, 0u);
  EXPECT_EQ(gpu.stats.streamed_bytes, 0u);
  if (GetParam() != "exact") EXPECT_GT(host.stats.pages.pages[size_t(route::compressed_format(route::parse_kind(GetParam())))], 0u)
      << "the route read no compressed page";
  ASSERT_EQ(host.logits.size(), gpu.logits.size());
  for (size_t i = 0; i < host.logits.size(); ++i) {
    ASSERT_EQ(0, std::memcmp(host.logits[i].data(), gpu.logits[i].data(), host.logits[i].size() * sizeof(float)))
        << GetParam() << ": step " << i << " differs between host and gpu placement";
    ASSERT_EQ(0, std::memcmp(host.logits[i].data(), again.logits[i].data(), host.logits[i].size() * sizeof(float)))
        << GetParam() << ": step " << i << " differs run to run";
  }
  EXPECT_EQ(host.tokens, gpu.tokens);
  std::printf("[measured] %s: %d steps bitwise equal (host streamed %.1f MiB/step)\n", GetParam().c_str(), steps,
              double(host.stats.streamed_bytes) / steps / (1 << 20));
}

INSTANTIATE_TEST_SUITE_P(Routes, PlacementExactness, ::testing::Values("exact", "lossless13", "int8s", "hybrid"));

// Co-attention (RuntimeOptions::cpu_share, issue 12): half of each layer's
// pages attended by the host CPU in place, the rest streamed. Attention over
// the same keys by another fp32 kernel: fed the all-streamed run's tokens
// (teacher forcing: a near tie may flip a greedy choice, as between the CPU
// and GPU paths), the logits follow that run closely at every step, and a
// second run gives the same bits (the plan is fixed; the CPU result does not
// depend on its thread count).
class CoAttention : public ::testing::TestWithParam<std::string> {};

TEST_P(CoAttention, HalfThePagesOnTheHostCpuFollowTheStreamedRun) {
  NEED_GPU();
  const int steps = 40;
  const DecodeRun link = decode_run(GetParam(), route::KvPlacement::host, steps);
  const DecodeRun co = decode_run(GetParam(), route::KvPlacement::host, steps, false, 0.5, &link.tokens);
  const DecodeRun again = decode_run(GetParam(), route::KvPlacement::host, steps, false, 0.5, &link.tokens);
  EXPECT_GT(co.stats.cpu_bytes, 0u) << "no page went to the CPU";
  EXPECT_LT(co.stats.streamed_bytes, link.stats.streamed_bytes);
  EXPECT_EQ(link.stats.cpu_bytes, 0u);
  double worst = 0;
  for (size_t i = 0; i < co.logits.size(); ++i) {
    for (size_t j = 0; j < co.logits[i].size(); ++j)
      worst = std::max(worst, double(std::fabs(co.logits[i][j] - link.logits[i][j])));
    ASSERT_EQ(0, std::memcmp(co.logits[i].data(), again.logits[i].data(), co.logits[i].size() * sizeof(float)))
        << GetParam() << ": step " << i << " differs run to run";
  }
  std::printf("[measured] %s co-attention: max |logit diff| vs all-streamed %.3g over %d steps; CPU %.2f MiB/step, "
              "streamed %.2f MiB/step\n", GetParam().c_str(), worst, steps,
              double(co.stats.cpu_bytes) / steps / (1 << 20), double(co.stats.streamed_bytes) / steps / (1 << 20));
  // Measured on the H200 at ca5fc0b (teacher-forced, 40 steps): max |logit
  // diff| 1.01 exact, 1.36 int8s, 0.98 hybrid -- the size SmolLM2 gives any
  // change of fp32 order in attention (the segmented streamed prefill, only
  // a different merge order, measures 0.575); greedy choices equal at 39, 38
  // and 37 of 40 steps. Bounds: ~3x the worst logit difference, and at most
  // 3x the measured disagreements (3 of 40 -> 9). A broken share (pages read
  // wrong) measured 31-43.
  EXPECT_LT(worst, 4.0);
  int same = 0;
  for (int i = 1; i <= steps; ++i) same += co.tokens[size_t(i)] == link.tokens[size_t(i)];
  std::printf("[measured] %s co-attention: greedy choice equal to the all-streamed run's at %d of %d steps\n",
              GetParam().c_str(), same, steps);
  EXPECT_GE(same, steps - 9);
}

INSTANTIATE_TEST_SUITE_P(Routes, CoAttention, ::testing::Values("exact", "int8s", "hybrid"));

// Partial residency (issue 12 part 3; route/residency.h): a GPU budget of
// 4.5 bf16 pages per layer where the context needs 6, so --kv-placement auto
// chooses partial: the tail, the sink, the newest full page and what else
// fits stay resident (encoded pages cost their encoded bytes), the rest
// streams. The
// engine reads the same bytes with the same kernels and split boundaries
// wherever a page lies, so the logits are bitwise those of the all-streamed
// run (and the tokens the same), over steps that cross a page boundary (the
// full tail page moves to the resident pool on the GPU, a new tail starts).
size_t partial_budget() {
  const model::ModelConfig& c = testing::shared_model().config();
  const size_t page_bytes = size_t(64) * size_t(c.n_kv_heads) * size_t(c.head_dim) * 2 * 2;  // K and V, bf16
  // 4.5 pages a layer of the 6 the context needs: the prompt's streamed
  // prefill needs ~4.1 (H200 at a19b90f: 3.6 pages = 5.1 MiB was refused,
  // "streaming it needs at least 5.7 MiB").
  return size_t(c.n_layers) * page_bytes * 45 / 10;
}

class PartialResidency : public ::testing::TestWithParam<std::string> {};

TEST_P(PartialResidency, AutoKeepsTheHotPagesResidentAndGivesTheAllStreamedBits) {
  NEED_GPU();
  const int steps = 50;  // a new tail page at 320: the full one moves to the resident pool (exact, hybrid)
  const DecodeRun host = decode_run(GetParam(), route::KvPlacement::host, steps);
  const DecodeRun part = decode_run(GetParam(), route::KvPlacement::automatic, steps, false, 0, nullptr,
                                    partial_budget());
  ASSERT_EQ(part.stats.placement.placement, route::KvPlacement::partial) << part.stats.placement.reason;
  EXPECT_GT(part.stats.residency.resident_pages, 1u) << part.stats.residency.describe();
  EXPECT_GT(part.stats.resident_bytes, host.stats.resident_bytes) << "no page but the tails was resident";
  EXPECT_LT(part.stats.streamed_bytes, host.stats.streamed_bytes);
  if (GetParam() == "int8s") {
    // Its encoded pages (about half a bf16 page) all fit the smallest budget
    // the prompt's streamed prefill allows here (H200 at 3d80a60: 6 of 6
    // pages a layer resident, 5 of them encoded): this case checks that
    // resident encoded pages give the all-streamed bits; exact and hybrid
    // are the cases with pages left to stream.
    EXPECT_EQ(part.stats.streamed_bytes, 0u) << part.stats.residency.describe();
  } else {
    EXPECT_LT(part.stats.residency.resident_pages, part.stats.residency.layer_pages)
        << part.stats.residency.describe();
    EXPECT_GT(part.stats.streamed_bytes, 0u) << "the budget held everything: not a partial test";
  }
  EXPECT_GT(part.stats.resident_pages, host.stats.resident_pages);
  EXPECT_GT(part.stats.residency_upload_bytes, 0u) << "the prompt's hot pages were never uploaded";
  ASSERT_EQ(host.logits.size(), part.logits.size());
  for (size_t i = 0; i < host.logits.size(); ++i)
    ASSERT_EQ(0, std::memcmp(host.logits[i].data(), part.logits[i].data(), host.logits[i].size() * sizeof(float)))
        << GetParam() << ": step " << i << " differs between host and partial placement";
  EXPECT_EQ(host.tokens, part.tokens);
  std::printf("[measured] %s partial: %s; per step %.1f pages resident, %.1f streamed; streamed %.2f MiB/step "
              "(host %.2f), resident %.2f MiB/step, uploaded %.2f MiB once\n",
              GetParam().c_str(), part.stats.placement.reason.c_str(),
              double(part.stats.resident_pages) / steps, double(part.stats.streamed_pages) / steps,
              double(part.stats.streamed_bytes) / steps / (1 << 20), double(host.stats.streamed_bytes) / steps / (1 << 20),
              double(part.stats.resident_bytes) / steps / (1 << 20),
              double(part.stats.residency_upload_bytes) / (1 << 20));
}

// Partial residency with co-attention: the CPU takes half of each layer's
// pages, never a resident one (the same change of fp32 order as
// CoAttention above), teacher-forced on the all-streamed run's tokens.
TEST_P(PartialResidency, WithAHostCpuShareTheCpuTakesOnlyStreamedPages) {
  NEED_GPU();
  if (GetParam() == "int8s") GTEST_SKIP() << "every int8s page is resident at this budget: none left for the CPU";
  const int steps = 50;
  const DecodeRun host = decode_run(GetParam(), route::KvPlacement::host, steps);
  const DecodeRun part = decode_run(GetParam(), route::KvPlacement::partial, steps, false, 0, &host.tokens,
                                    partial_budget());
  const DecodeRun co = decode_run(GetParam(), route::KvPlacement::partial, steps, false, 0.5, &host.tokens,
                                  partial_budget());
  EXPECT_GT(co.stats.cpu_bytes, 0u) << "no page went to the CPU";
  EXPECT_LT(co.stats.streamed_bytes, part.stats.streamed_bytes);
  EXPECT_EQ(co.stats.resident_bytes, part.stats.resident_bytes) << "the CPU took a resident page";
  double worst = 0;
  for (size_t i = 0; i < co.logits.size(); ++i)
    for (size_t j = 0; j < co.logits[i].size(); ++j)
      worst = std::max(worst, double(std::fabs(co.logits[i][j] - host.logits[i][j])));
  std::printf("[measured] %s partial + CPU 50 %%: max |logit diff| vs all-streamed %.3g; per step %.1f pages "
              "resident, %.1f streamed, %.1f CPU\n",
              GetParam().c_str(), worst, double(co.stats.resident_pages) / steps,
              double(co.stats.streamed_pages) / steps, double(co.stats.cpu_pages) / steps);
  EXPECT_LT(worst, 3.0);  // ~3x the worst measured here: 0.957 (exact), 0.86 (hybrid) on the H200 at 189d72b
}

INSTANTIATE_TEST_SUITE_P(Routes, PartialResidency, ::testing::Values("exact", "int8s", "hybrid"));

// CUDA graphs (RuntimeOptions::cuda_graphs): a decode step captured and
// launched as one graph runs the same kernels with the same arguments as
// kernel-by-kernel launches, so tokens and logits are bitwise the same, over
// steps that cross a page boundary (a new page: a new split, a work-list
// patch) and, for hybrid, pages moving to int8s (a new int8s launch: a new
// graph topology). With gpu placement every step but the first (eager, for
// one-time initialisation) is a graph; host placement is never captured.
using GraphCase = std::tuple<std::string, route::KvPlacement>;
class CudaGraphExactness : public ::testing::TestWithParam<GraphCase> {};

TEST_P(CudaGraphExactness, GraphsOnAndOffGiveTheSameBits) {
  NEED_GPU();
  const auto& [route, placement] = GetParam();
  const int steps = 48;  // 280 + 48 crosses the page boundary at 320
  const DecodeRun off = decode_run(route, placement, steps, false);
  const DecodeRun on = decode_run(route, placement, steps, true);
  EXPECT_EQ(off.stats.graph_steps, 0u);
  if (placement == route::KvPlacement::gpu) {
    EXPECT_EQ(on.stats.graph_steps, size_t(steps - 1)) << "every decode step but the first runs as a graph";
    EXPECT_GE(on.stats.graph_instantiations, 1u);
    // Most steps only change kernel arguments: cudaGraphExecUpdate, no new instantiation.
    EXPECT_LT(on.stats.graph_instantiations, on.stats.graph_steps / 2)
        << "the step graph was re-instantiated on most steps (cudaGraphExecUpdate refused)";
  } else {
    EXPECT_EQ(on.stats.graph_steps, 0u) << "host placement is not captured";
  }
  ASSERT_EQ(off.logits.size(), on.logits.size());
  for (size_t i = 0; i < off.logits.size(); ++i)
    ASSERT_EQ(0, std::memcmp(off.logits[i].data(), on.logits[i].data(), off.logits[i].size() * sizeof(float)))
        << route << ": step " << i << " differs between graphs on and off";
  EXPECT_EQ(off.tokens, on.tokens);
  std::printf("[measured] %s %s: %d steps bitwise equal, %zu graph steps, %zu instantiations\n", route.c_str(),
              route::placement_name(placement).c_str(), steps, on.stats.graph_steps, on.stats.graph_instantiations);
}

INSTANTIATE_TEST_SUITE_P(RoutesAndPlacements, CudaGraphExactness,
                         ::testing::Combine(::testing::Values("exact", "hybrid"),
                                            ::testing::Values(route::KvPlacement::gpu, route::KvPlacement::host)));

// A prompt after graphed decode steps (prefill is never captured; its chunk
// may regrow the forward's buffers), then graphed steps again, with a
// sampler that draws (its draw counter is a kernel argument captured anew
// each step): the same tokens and last logits as without graphs.
TEST(GpuRuntime, APromptAfterGraphedDecodeStepsStillWorks) {
  NEED_GPU();
  const std::vector<int32_t> ids = golden_ids();
  auto run = [&](bool graphs) {
    runtime::RuntimeOptions o = options(400, "exact", route::KvPlacement::gpu);
    o.cuda_graphs = graphs;
    o.sampling.temperature = 0.8f;
    o.sampling.seed = 7;
    runtime::GpuRuntime rt(testing::model_file(), testing::shared_model().config(), o);
    std::vector<int32_t> tokens{rt.prefill(std::span(ids).first(100))};
    for (int i = 0; i < 40; ++i) tokens.push_back(rt.decode(tokens.back()));  // crosses page 1 -> 2
    tokens.push_back(rt.prefill(std::span(ids).subspan(100, 100)));
    for (int i = 0; i < 30; ++i) tokens.push_back(rt.decode(tokens.back()));
    EXPECT_EQ(rt.n_tokens(), 100 + 40 + 100 + 30);
    EXPECT_EQ(rt.stats().graph_steps, graphs ? 69u : 0u);  // 70 decode steps, the first eager
    return std::make_pair(tokens, rt.last_logits());
  };
  const auto off = run(false);
  const auto on = run(true);
  EXPECT_EQ(off.first, on.first);
  EXPECT_EQ(0, std::memcmp(off.second.data(), on.second.data(), off.second.size() * sizeof(float)));
}

// Lookahead (RuntimeOptions::lookahead): with graphs, the step after each
// decode step is enqueued before that step's token is read back, fed the
// token sampled on the GPU; when the next call asks for that token it is
// used, else discarded (its sampler draw given back, its K/V row written
// over). Either way the same bits as without lookahead: sampled generation
// (temperature: the draw counter), teacher forcing every third step (steps
// ahead discarded), a prompt after decode steps (the step ahead discarded),
// and last_logits after each step (the step ahead writes the other row); on
// the exact route and on int8s, where a page filled by step n is published
// (conversion inside the step here) when step n commits -- after step n+1's
// tables were built ahead, so that step is discarded and rebuilt (a review
// found it reused, reading the page exact where without lookahead it is int8s).
TEST(GpuRuntime, LookaheadOnAndOffGiveTheSameBits) {
  NEED_GPU();
  const std::vector<int32_t> ids = golden_ids();
  struct Run {
    std::vector<int32_t> tokens;
    std::vector<std::vector<float>> logits;
    runtime::RuntimeStats stats;
  };
  auto run = [&](const std::string& route, bool lookahead, bool forcing) {
    runtime::RuntimeOptions o = options(400, route, route::KvPlacement::gpu);
    o.cuda_graphs = true;
    o.lookahead = lookahead;
    o.sampling.temperature = 0.8f;
    o.sampling.seed = 11;
    runtime::GpuRuntime rt(testing::model_file(), testing::shared_model().config(), o);
    Run r;
    r.tokens.push_back(rt.prefill(std::span(ids).first(100)));
    for (int i = 0; i < 40; ++i) {  // crosses page 1 -> 2 (pages of 64)
      r.tokens.push_back(rt.decode(forcing && i % 3 == 1 ? ids[size_t(100 + i)] : r.tokens.back()));
      r.logits.push_back(rt.last_logits());
    }
    r.tokens.push_back(rt.prefill(std::span(ids).subspan(140, 50)));
    for (int i = 0; i < 20; ++i) r.tokens.push_back(rt.decode(r.tokens.back()));
    r.logits.push_back(rt.last_logits());
    r.stats = rt.stats();
    return r;
  };
  for (const std::string route : {"exact", "int8s"})
  for (const bool forcing : {false, true}) {
    SCOPED_TRACE(route + (forcing ? ": teacher forcing every third step" : ": free running"));
    const Run off = run(route, false, forcing), on = run(route, true, forcing);
    EXPECT_EQ(off.tokens, on.tokens);
    ASSERT_EQ(off.logits.size(), on.logits.size());
    for (size_t i = 0; i < off.logits.size(); ++i)
      ASSERT_EQ(0, std::memcmp(off.logits[i].data(), on.logits[i].data(), off.logits[i].size() * sizeof(float)))
          << "step " << i;
    EXPECT_EQ(off.stats.lookahead_steps, 0u);
    EXPECT_EQ(on.stats.graph_steps, off.stats.graph_steps);
    EXPECT_EQ(on.stats.decode_steps, off.stats.decode_steps);
    // The route figures count committed steps only: a step ahead (discarded,
    // or in flight at the end) adds nothing.
    for (int f = 0; f < 3; ++f) EXPECT_EQ(on.stats.pages.pages[f], off.stats.pages.pages[f]) << "format " << f;
    EXPECT_EQ(on.stats.pages.bytes, off.stats.pages.bytes);
    EXPECT_EQ(on.stats.resident_pages, off.stats.resident_pages);
    // Free running: every graphed step but the first of each decode run was
    // enqueued ahead (the first eager step and the one after a prompt are not).
    // (int8s: and the one after each page publication.)
    if (!forcing && route == "exact") EXPECT_GE(on.stats.lookahead_steps, on.stats.graph_steps - 2);
    if (!forcing) EXPECT_GE(on.stats.lookahead_steps, on.stats.graph_steps / 2);
    EXPECT_GE(on.stats.lookahead_discarded, forcing ? 10u : 1u);  // at least the prompt's
    std::printf("[measured] lookahead (%s, %s): %zu steps used ahead, %zu discarded, of %zu decode steps\n",
                route.c_str(), forcing ? "forcing" : "free", on.stats.lookahead_steps, on.stats.lookahead_discarded,
                on.stats.decode_steps);
  }
}

// Programmatic dependent launch (activekv/cuda/launch.h) lets a kernel start
// while the one before it drains; each waits (griddepcontrol.wait) before it
// touches anything earlier kernels wrote. A missing wait would read stale
// activations: tokens and every step's logits must be bitwise those of
// serialised launches, graphed (gpu placement) and eager, resident and
// streamed, with the int8s kernels (launched plainly) between the PDL ones,
// and in the GGUF weight layout, whose Q4_1 matrices go to the chunked
// matvec (its cp.async prologue before the wait) instead of the register kernel.
// (A race need not show in one run; this is the check a test can make.)
struct ProgrammaticLaunchScope {
  bool before = cuda::programmatic_launch();
  explicit ProgrammaticLaunchScope(bool on) { cuda::set_programmatic_launch(on); }
  ~ProgrammaticLaunchScope() { cuda::set_programmatic_launch(before); }
};

/// Sets (value) or unsets (nullptr) an environment variable for one scope.
struct EnvScope {
  std::string name;
  std::optional<std::string> before;
  EnvScope(const char* n, const char* value) : name(n) {
    if (const char* b = std::getenv(n)) before = b;
    if (value) setenv(n, value, 1);
    else unsetenv(n);
  }
  ~EnvScope() {
    if (before) setenv(name.c_str(), before->c_str(), 1);
    else unsetenv(name.c_str());
  }
};

TEST(GpuRuntime, ProgrammaticLaunchOnAndOffGiveTheSameBits) {
  NEED_GPU();
  {
    const ProgrammaticLaunchScope probe(true);
    if (!cuda::programmatic_launch()) GTEST_SKIP() << "no programmatic dependent launch in this build or driver";
  }
  const std::vector<int32_t> ids = golden_ids();
  struct Config {
    const char* route;
    route::KvPlacement placement;
    bool graphs;
    bool gguf_layout = false;
  };
  auto run = [&](const Config& c, bool pdl) {
    const ProgrammaticLaunchScope scope(pdl);
    runtime::RuntimeOptions o = options(400, c.route, c.placement);
    o.cuda_graphs = c.graphs;
    std::unique_ptr<runtime::GpuRuntime> rt_owner;
    {
      const EnvScope layout("ACTIVEKV_WEIGHT_LAYOUT", c.gguf_layout ? "gguf" : nullptr);  // read as the weights load
      rt_owner = std::make_unique<runtime::GpuRuntime>(testing::model_file(), testing::shared_model().config(), o);
    }
    runtime::GpuRuntime& rt = *rt_owner;
    std::vector<int32_t> tokens{rt.prefill(std::span(ids).first(100))};
    std::vector<std::vector<float>> logits;
    for (int i = 0; i < 30; ++i) {  // crosses page 1 -> 2 (pages of 64)
      tokens.push_back(rt.decode(tokens.back()));
      logits.push_back(rt.last_logits());
    }
    return std::make_pair(tokens, logits);
  };
  for (const Config& c : {Config{"exact", route::KvPlacement::gpu, true}, Config{"exact", route::KvPlacement::gpu, false},
                          Config{"exact", route::KvPlacement::host, false}, Config{"int8s", route::KvPlacement::gpu, true},
                          Config{"int8s", route::KvPlacement::host, false},
                          Config{"exact", route::KvPlacement::gpu, true, true}}) {
    SCOPED_TRACE(std::string(c.route) + (c.placement == route::KvPlacement::gpu ? " gpu" : " host") +
                 (c.graphs ? " graphs" : " eager") + (c.gguf_layout ? ", GGUF layout" : ""));
    const auto off = run(c, false), on = run(c, true);
    EXPECT_EQ(off.first, on.first);
    ASSERT_EQ(off.second.size(), on.second.size());
    for (size_t i = 0; i < off.second.size(); ++i)
      ASSERT_EQ(0, std::memcmp(off.second[i].data(), on.second[i].data(), off.second[i].size() * sizeof(float)))
          << "step " << i;
  }
}

// A second prompt after decode steps (a chat's next turn; `activekv bench`'s
// pp row after its tg row): with host placement each layer keeps one tail page
// on the GPU, and the earlier decode's tail must give its slot back when the
// new prompt moves the tail on (it did not: "all 30 GPU page slots are in
// use", found by `activekv bench` on the H200). Host and gpu placement give
// the same bits all along.
TEST(GpuRuntime, APromptAfterDecodeStepsMovesTheTailPage) {
  NEED_GPU();
  const std::vector<int32_t> ids = golden_ids();
  auto run = [&](route::KvPlacement placement) {
    runtime::GpuRuntime rt(testing::model_file(), testing::shared_model().config(), options(400, "exact", placement));
    std::vector<int32_t> tokens{rt.prefill(std::span(ids).first(100))};  // tail in page 1 (pages of 64)
    for (int i = 0; i < 40; ++i) tokens.push_back(rt.decode(tokens.back()));  // tail moves to page 2
    tokens.push_back(rt.prefill(std::span(ids).subspan(100, 100)));            // tail in page 3
    for (int i = 0; i < 30; ++i) tokens.push_back(rt.decode(tokens.back()));
    std::vector<float> logits = rt.last_logits();
    EXPECT_EQ(rt.n_tokens(), 100 + 40 + 100 + 30);
    return std::make_pair(tokens, logits);
  };
  const auto host = run(route::KvPlacement::host);
  const auto gpu = run(route::KvPlacement::gpu);
  EXPECT_EQ(host.first, gpu.first);
  EXPECT_EQ(0, std::memcmp(host.second.data(), gpu.second.data(), host.second.size() * sizeof(float)));
}

TEST(GpuRuntime, GpuPlacementThatDoesNotFitNamesTheSizes) {
  NEED_GPU();
  runtime::RuntimeOptions o = options(4096, "exact", route::KvPlacement::gpu);
  o.gpu_kv_mem = 1 << 20;  // 1 MiB: far too small for 4096 tokens x 30 layers
  try {
    runtime::GpuRuntime rt(testing::model_file(), testing::shared_model().config(), o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("GiB"), std::string::npos) << e.what();
  }
}

TEST(GpuRuntime, ContextOverflowAndBadTokensKeepTheHistory) {
  NEED_GPU();
  runtime::GpuRuntime rt(testing::model_file(), testing::shared_model().config(),
                         options(8, "exact", route::KvPlacement::host));
  const int32_t prompt[4] = {1, 2, 3, 4};
  const int32_t t = rt.prefill(prompt);
  EXPECT_THROW(rt.decode(-1), InvalidArgument);
  EXPECT_EQ(rt.n_tokens(), 4);
  const int32_t five[5] = {1, 2, 3, 4, 5};
  EXPECT_THROW(rt.prefill(five), InvalidArgument);  // 4 + 5 > 8
  EXPECT_EQ(rt.n_tokens(), 4);
  EXPECT_NO_THROW(rt.decode(t));
  EXPECT_EQ(rt.n_tokens(), 5);
}

// ---- Streamed prefill (issue 9, item 6) ----
// A prompt of 3000 tokens of real prose prefilled with its history resident
// (default budget) and streamed per chunk (--gpu-kv-mem below what resident
// needs, computed from the page size). SmolLM2-135M: 30 layers, 3 KV heads x
// 64; pages of 256 tokens. Both runs use chunks of 512 tokens (stream_chunk
// = prefill_chunk): the same forward passes, so any difference is the
// attention's.
constexpr int kStreamPage = 256;
constexpr int kStreamChunk = 512;
constexpr int kStreamPrompt = 3000;
constexpr int kStreamDecode = 16;

std::vector<int32_t> prose_ids(size_t n) {
  std::ifstream in(std::string(ACTIVEKV_SOURCE_DIR) + "/data/texts/pride-and-prejudice.txt", std::ios::binary);
  if (!in) throw std::runtime_error("data/texts/pride-and-prejudice.txt missing");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  text.resize(std::min(text.size(), 10 * n));  // ~4 bytes a token: room to spare
  std::vector<int32_t> ids = Tokenizer::from_gguf(testing::model_file()).encode(text, true);
  if (ids.size() < n) throw std::runtime_error("the text gave too few tokens");
  ids.resize(n);
  return ids;
}

size_t stream_page_bytes() {
  const model::ModelConfig& c = testing::shared_model().config();
  return size_t(2) * c.n_kv_heads * kStreamPage * c.head_dim * 2;  // K and V, bf16
}

// Device pages of the budgets: each layer's decode tail page and the pages a
// 512-token chunk can touch (3), plus two staging buffers of `staging` pages.
size_t stream_budget_pages(int64_t staging) {
  const int L = testing::shared_model().config().n_layers;
  return size_t(L) * size_t(1 + route::pages_spanned(kStreamChunk, kStreamPage)) + 2 * size_t(staging);
}
// Pages of one layer the last chunk (at 2560) reads from the host: 10.
constexpr int64_t kStreamHistoryPages = (kStreamPrompt - 1) / kStreamChunk * kStreamChunk / kStreamPage;

struct PrefillRun {
  std::vector<float> logits;  // [prompt][vocab]
  std::vector<int32_t> tokens;  // greedy: argmax of the last prompt row, then kStreamDecode decode steps
  std::vector<std::vector<float>> decode_logits;
  runtime::RuntimeStats stats;  // after the prefill
};

// gpu_kv_pages = 0: the default budget (the prompt's 390 pages fit it).
PrefillRun prefill_run(size_t gpu_kv_pages) {
  const std::vector<int32_t> ids = prose_ids(kStreamPrompt);
  runtime::RuntimeOptions o = options(kStreamPrompt + kStreamDecode + 1, "exact", route::KvPlacement::host);
  o.page_size = kStreamPage;
  o.prefill_chunk = kStreamChunk;
  o.stream_chunk = kStreamChunk;
  o.gpu_kv_mem = gpu_kv_pages * stream_page_bytes();
  runtime::GpuRuntime rt(testing::model_file(), testing::shared_model().config(), o);
  PrefillRun r;
  r.logits = rt.prefill_logits(ids);
  r.stats = rt.stats();
  const size_t vocab = size_t(testing::shared_model().config().vocab_size);
  r.tokens.push_back(model::argmax(std::span<const float>(r.logits.data() + (ids.size() - 1) * vocab, vocab)));
  for (int i = 0; i < kStreamDecode; ++i) {
    r.tokens.push_back(rt.decode(r.tokens.back()));
    r.decode_logits.push_back(rt.last_logits());
  }
  return r;
}

// The bytes a streamed prefill must move, counted by hand: chunks start at
// 0, 512, ..., 2560, reading 0, 2, 4, 6, 8, 10 full pages of every layer.
size_t expected_moved_bytes() {
  return size_t(0 + 2 + 4 + 6 + 8 + 10) * size_t(testing::shared_model().config().n_layers) * stream_page_bytes();
}

TEST(GpuRuntimeStreamedPrefill, WholeLayerStagingIsBitwiseTheResidentPrefill) {
  NEED_GPU();
  const PrefillRun resident = prefill_run(0);
  const PrefillRun streamed = prefill_run(stream_budget_pages(kStreamHistoryPages));
  EXPECT_FALSE(resident.stats.prefill_streamed);
  EXPECT_EQ(resident.stats.prefill_moved_bytes, 0u);
  ASSERT_TRUE(streamed.stats.prefill_streamed);
  EXPECT_EQ(streamed.stats.prefill_chunk, kStreamChunk);
  EXPECT_EQ(streamed.stats.prefill_staging_pages, kStreamHistoryPages);  // a buffer holds a layer's history
  EXPECT_EQ(streamed.stats.prefill_moved_bytes, expected_moved_bytes());
  ASSERT_EQ(resident.logits.size(), streamed.logits.size());
  EXPECT_EQ(0, std::memcmp(resident.logits.data(), streamed.logits.data(), resident.logits.size() * sizeof(float)))
      << "prefill logits differ between resident and whole-layer streamed prefill";
  EXPECT_EQ(resident.tokens, streamed.tokens);
  for (size_t i = 0; i < resident.decode_logits.size(); ++i)
    ASSERT_EQ(0, std::memcmp(resident.decode_logits[i].data(), streamed.decode_logits[i].data(),
                             resident.decode_logits[i].size() * sizeof(float)))
        << "decode step " << i << " after the prefill differs";
  std::printf("[measured] streamed prefill (whole layer, 2 x %lld pages): %.1f MiB moved, logits bitwise equal\n",
              (long long)streamed.stats.prefill_staging_pages,
              double(streamed.stats.prefill_moved_bytes) / (1 << 20));
}

// Staging of 2 pages per buffer: chunks from 1024 on attend their history in
// 2..5 segments plus their own pages, merged pairwise. Bound on |dlogit|
// against the resident run, derived (not yet measured -- the lead runs it):
// the segments and the resident run's own key splits are the same kernel
// cutting the keys at different places; test_prefill.cpp measured split vs
// unsplit O within 1.5e-5 relative on the H200 (asserted 5e-5 there), and
// the fp32 merges add ~1e-6 (5 merges of a few 2^-24, LSE ~10). The GPU-vs-CPU
// test above measured 0.62 logits for the bf16 GEMM rounding of ~2^-9 = 2e-3
// relative everywhere: ~300 logits per unit of relative error, so 1.6e-5 ->
// ~0.005 logits -- an estimate the H200 refuted at 486ee2a: measured 0.575
// over the 3000 positions. A 1e-5 change of an attention output flips the
// bf16 rounding of some K/V written to the pages, and that flip, not the
// merge's own error, is what 30 layers carry forward (the GPU-vs-CPU figure,
// 0.62, has the same character). Asserted at ~3x the measured; the greedy
// continuation did not move.
constexpr double kSegmentedBound = 1.7;

TEST(GpuRuntimeStreamedPrefill, SegmentedStagingFollowsTheResidentPrefillWithinTheMergeBound) {
  NEED_GPU();
  const PrefillRun resident = prefill_run(0);
  const PrefillRun segmented = prefill_run(stream_budget_pages(2));
  ASSERT_TRUE(segmented.stats.prefill_streamed);
  EXPECT_EQ(segmented.stats.prefill_staging_pages, 2);  // the last chunk: 5 segments of history
  EXPECT_EQ(segmented.stats.prefill_moved_bytes, expected_moved_bytes());
  ASSERT_EQ(resident.logits.size(), segmented.logits.size());
  double max_delta = 0;
  for (size_t i = 0; i < resident.logits.size(); ++i) {
    ASSERT_TRUE(std::isfinite(segmented.logits[i])) << "logit " << i;
    max_delta = std::max(max_delta, double(std::abs(resident.logits[i] - segmented.logits[i])));
  }
  std::printf("[measured] streamed prefill (segments of 2 pages) vs resident: max |dlogit| %.3g over %d positions\n",
              max_delta, kStreamPrompt);
  EXPECT_LE(max_delta, kSegmentedBound);
  EXPECT_EQ(resident.tokens, segmented.tokens);
  // Segmented twice: the same bits (fixed merge order, no atomics).
  const PrefillRun again = prefill_run(stream_budget_pages(2));
  EXPECT_EQ(0, std::memcmp(again.logits.data(), segmented.logits.data(), again.logits.size() * sizeof(float)));
}

TEST(GpuRuntimeStreamedPrefill, ABudgetBelowStreamingsMinimumNamesTheSizesAndKeepsTheHistory) {
  NEED_GPU();
  runtime::RuntimeOptions o = options(kStreamPrompt + 1, "exact", route::KvPlacement::host);
  o.page_size = kStreamPage;
  o.prefill_chunk = kStreamChunk;
  o.stream_chunk = kStreamChunk;
  o.gpu_kv_mem = (stream_budget_pages(1) - 1) * stream_page_bytes();  // one page short of 2 staging pages
  runtime::GpuRuntime rt(testing::model_file(), testing::shared_model().config(), o);
  const int32_t four[4] = {1, 2, 3, 4};
  rt.prefill(four);  // 4 tokens fit resident
  EXPECT_FALSE(rt.stats().prefill_streamed);
  try {
    rt.prefill(prose_ids(kStreamPrompt - 4));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("--gpu-kv-mem"), std::string::npos) << m;
  }
  EXPECT_EQ(rt.n_tokens(), 4);
}

}  // namespace
}  // namespace activekv
