// `activekv bench --parallel` without a GPU (src/cli/bench_parallel.h): the
// argument checks, the row labels and aggregate t/s, the floor's arithmetic
// with rounds, the up-front memory checks, and the driver against a fake
// group of sequences (what each forward pass is given, what the rows record).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "activekv/core/error.h"
#include "bench_parallel.h"
#include "memory.h"

namespace activekv::cli {
namespace {

// Runs f, expects Error whose message holds `text`.
template <typename F>
void expect_error(F&& f, const std::string& text) {
  try {
    f();
    FAIL() << "no error; expected one saying '" << text << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

ModelBenchArgs parallel_args() {
  ModelBenchArgs a;
  a.parallel = {16, 1, 8};
  a.n_gen = 32;
  return a;
}

// A one-layer model shape: the driver needs only its counts.
model::ModelConfig tiny_config() {
  model::ModelConfig c;
  c.n_layers = 1;
  c.n_kv_heads = 1;
  c.head_dim = 64;
  c.vocab_size = 100;
  return c;
}

TEST(BenchParallel, RoundsAreTheForwardPassesOfAStep) {
  EXPECT_EQ(batch_rounds(1, 8), 1);
  EXPECT_EQ(batch_rounds(8, 8), 1);
  EXPECT_EQ(batch_rounds(9, 8), 2);
  EXPECT_EQ(batch_rounds(16, 8), 2);
  EXPECT_EQ(batch_rounds(17, 8), 3);
  EXPECT_THROW(batch_rounds(0, 8), InvalidArgument);
  EXPECT_THROW(batch_rounds(4, 0), InvalidArgument);
}

TEST(BenchParallel, ValuesAreSortedAndBadOnesRefused) {
  EXPECT_EQ(parallel_values({16, 1, 8}), (std::vector<int>{1, 8, 16}));
  expect_error([] { parallel_values({}); }, "--parallel needs at least one value");
  expect_error([] { parallel_values({0}); }, "--parallel 0: a count of sequences is in [1, 1024]");
  expect_error([] { parallel_values({2000}); }, "--parallel 2000");
  expect_error([] { parallel_values({8, 1, 8}); }, "--parallel 8 is given twice");
}

TEST(BenchParallel, ArgumentChecks) {
  EXPECT_NO_THROW(check_parallel_args(parallel_args(), "cuda"));
  expect_error([] { check_parallel_args(parallel_args(), "cpu"); }, "bench: --parallel needs a GPU (--device cuda");
  ModelBenchArgs a = parallel_args();
  a.n_gen = 0;
  expect_error([&] { check_parallel_args(a, "cuda"); }, "-n 0 must be > 0");
  a = parallel_args();
  a.prompts_given = true;
  expect_error([&] { check_parallel_args(a, "cuda"); }, "leave out -p");
  a = parallel_args();
  a.cuda_graphs = "on";
  expect_error([&] { check_parallel_args(a, "cuda"); }, "leave out --cuda-graphs");
  a = parallel_args();
  a.seq_gpu_kv_mem_gib = -1;
  expect_error([&] { check_parallel_args(a, "cuda"); }, "--seq-gpu-kv-mem -1: GiB >= 0");
  a = ModelBenchArgs{};
  a.seq_gpu_kv_mem_gib = 1;
  expect_error([&] { check_parallel_args(a, "cuda"); }, "--seq-gpu-kv-mem applies to --parallel only");
  EXPECT_NO_THROW(check_parallel_args(ModelBenchArgs{}, "cpu"));  // no --parallel: nothing of its own to check
}

TEST(BenchParallel, LabelsAndAggregateTokensPerSecond) {
  BenchRow r;
  r.kind = "tg";
  r.n_tokens = 32;
  r.depth = 32768;
  EXPECT_EQ(r.label(), "tg32 @ d32768");  // single-history rows unchanged
  r.n_seqs = 16;
  EXPECT_EQ(r.label(), "tg32 @ d32768 x16");
  r.depth = 0;
  EXPECT_EQ(r.label(), "tg32 x16");
  r.ms = {1000.0, 2000.0};  // 32 steps of 16 sequences: 512 tokens in 1 s, then in 2 s
  EXPECT_DOUBLE_EQ(r.tps_mean(), (512.0 + 256.0) / 2);
  EXPECT_DOUBLE_EQ(r.ms_per_token(), (1000.0 / 32 + 2000.0 / 32) / 2);  // per step
}

BenchDevice h200_like() {
  BenchDevice d;
  d.weight_bytes = 3.0e9;
  d.weight_gbps = 4600;
  d.h2d_gbps = 55;
  return d;
}

TEST(BenchParallel, FloorCountsTheWeightsOncePerRoundAndEverySequencesHistory) {
  const BenchDevice d = h200_like();
  // 16 sequences at 32K of the 27B shape: 16 x 2.147 GB of history per step, two rounds of 8.
  const double hist = 16 * 2.147e9;
  const StepFloor host = parallel_step_floor(d, "host", 2, hist, 0);
  EXPECT_NEAR(host.weight_ms, 2 * 3.0e9 / 4.6e12 * 1e3, 1e-9);
  EXPECT_NEAR(host.history_ms, hist / 55e9 * 1e3, 1e-9);  // H2D
  EXPECT_NEAR(host.total_ms(), host.weight_ms + host.history_ms, 1e-12);
  const StepFloor gpu = parallel_step_floor(d, "gpu", 2, hist, 0);
  EXPECT_NEAR(gpu.history_ms, hist / 4.6e12 * 1e3, 1e-9);  // HBM
  EXPECT_NEAR(parallel_step_floor(d, "host", 1, 0, 0).weight_ms * 3, parallel_step_floor(d, "host", 3, 0, 0).weight_ms,
              1e-12);
  const StepFloor partial = parallel_step_floor(d, "partial", 1, 1e9, 2e9);
  EXPECT_NEAR(partial.history_ms, 1e9 / 55e9 * 1e3 + 2e9 / 4.6e12 * 1e3, 1e-9);
}

TEST(BenchParallel, ContextAndBudgets) {
  // depth + rows x (reps x (warm-up + n) + the check step); depth 0 is filled with one token.
  EXPECT_EQ(parallel_context(32768, 3, 32, 3), 32768 + 3 * (3 * 33 + 1));
  EXPECT_EQ(parallel_context(0, 1, 4, 1), 1 + 6);
  EXPECT_EQ(parallel_seq_budget(160ull << 30, 16, 0), 10ull << 30);
  EXPECT_EQ(parallel_seq_budget(160ull << 30, 16, 2.5), uint64_t(2.5 * double(1ull << 30)));
}

TEST(BenchParallel, HostMemoryIsCheckedUpFrontWithAskedAndAvailable) {
  const uint64_t per_seq = 2ull << 30;
  EXPECT_NO_THROW(require_parallel_host_memory(16, per_seq, "x", 33ull << 30));
  EXPECT_NO_THROW(require_parallel_host_memory(16, per_seq, "x", 0));  // unknown: no check
  expect_error([&] { require_parallel_host_memory(16, per_seq, "32868 tokens of bf16", 31ull << 30); },
               "not enough memory for bench --parallel 16: 16 histories of 32868 tokens of bf16 (2.00 GiB");
  expect_error([&] { require_parallel_host_memory(16, per_seq, "x", 31ull << 30); }, "32.00 GiB (34359738368 bytes) "
               "asked, 31.00 GiB (33285996544 bytes) available");
  expect_error([&] { require_parallel_host_memory(2, std::numeric_limits<uint64_t>::max() / 2 + 1, "x", 1); },
               "asked");  // saturates, no overflow

  // From the model's shape: the 27B shape's 16 layers x 4 KV heads x 256 channels, bf16: 64 KiB per token
  // (4 KiB a layer: a page of 1024 tokens is 4 MiB).
  model::ModelConfig c;
  c.n_layers = 16;
  c.n_kv_heads = 4;
  c.head_dim = 256;
  ModelBenchArgs a = parallel_args();
  a.depths = {0, 32768};
  a.reps = 3;
  const ParallelHistory h = parallel_history(a, c, "bf16", 32768);
  const int64_t n_ctx = 32768 + 3 * (3 * 33 + 1);
  EXPECT_EQ(h.what, fmt::format("{} tokens of bf16", n_ctx));
  const uint64_t pages = uint64_t((n_ctx + 1023) / 1024);
  EXPECT_EQ(h.bytes, pages * 16 * (4ull << 20));
  EXPECT_GT(parallel_history(a, c, "hybrid", 32768).bytes, h.bytes);  // room for the int8s copy
  EXPECT_NO_THROW(require_parallel_host_fits(a, c, 16 * h.bytes));
  expect_error([&] { require_parallel_host_fits(a, c, 16 * h.bytes - 1); }, "bench --parallel 16: 16 histories");
}

TEST(BenchParallel, GpuBudgetIsCheckedUpFront) {
  const uint64_t G = 1ull << 30;
  EXPECT_NO_THROW(require_parallel_gpu_budget(16, "gpu", 2 * G, 8 * G, 128 * G, "x"));
  EXPECT_NO_THROW(require_parallel_gpu_budget(16, "host", 20 * G, 8 * G, 128 * G, "x"));  // host: nothing resident
  expect_error([&] { require_parallel_gpu_budget(16, "gpu", 9 * G, 8 * G, 128 * G, "32868 tokens of bf16"); },
               "bench --parallel 16 --kv-placement gpu: 16 resident histories of 32868 tokens of bf16 need 9.00 GiB");
  expect_error([&] { require_parallel_gpu_budget(16, "host", G, 9 * G, 128 * G, "x"); },
               "16 sequence budgets of 9.00 GiB (9663676416 bytes) ask 144.00 GiB");
}

// N sequences whose "forward pass" checks what it is given: each decode_batch
// at most max_batch distinct sequences; sampled token = appended token + 1.
class FakeGroup final : public ParallelGroup {
 public:
  FakeGroup(int n, int max_batch, int64_t n_ctx, float logit = 0.f)
      : max_batch_(max_batch), n_ctx_(n_ctx), tokens_(size_t(n)), logit_(logit) {}
  int size() const override { return int(tokens_.size()); }
  int max_batch() const override { return max_batch_; }
  int64_t n_tokens(int s) const override { return int64_t(tokens_[size_t(s)].size()); }
  int32_t prefill(int s, std::span<const int32_t> t) override {
    tokens_[size_t(s)].insert(tokens_[size_t(s)].end(), t.begin(), t.end());
    EXPECT_LE(n_tokens(s), n_ctx_);
    return t.back() + 1;
  }
  std::vector<int32_t> decode_batch(std::span<const int> seqs, std::span<const int32_t> t) override {
    EXPECT_EQ(seqs.size(), t.size());
    EXPECT_GE(int(seqs.size()), 1);
    EXPECT_LE(int(seqs.size()), max_batch_);
    if (batch_sizes) (*batch_sizes)[int(seqs.size())]++;
    last_pass_.assign(seqs.begin(), seqs.end());
    std::vector<int32_t> out;
    for (size_t k = 0; k < seqs.size(); ++k) {
      auto& h = tokens_[size_t(seqs[k])];
      bytes_ += 1000.0 * double(h.size());  // a step reads its whole history: 1000 bytes a token
      h.push_back(t[k]);
      EXPECT_LE(int64_t(h.size()), n_ctx_);
      out.push_back(t[k] + 1);
    }
    return out;
  }
  void wait_conversions() override {}
  double history_bytes() const override { return bytes_; }
  std::vector<float> last_logits(int s) const override {
    EXPECT_NE(std::find(last_pass_.begin(), last_pass_.end(), s), last_pass_.end()) << "logits of a sequence not in the last pass";
    return {0.f, logit_};
  }
  std::string placement() const override { return "host"; }

  std::map<int, int>* batch_sizes = nullptr;  ///< forward passes by their number of sequences

 private:
  int max_batch_;
  int64_t n_ctx_;
  std::vector<std::vector<int32_t>> tokens_;
  std::vector<int> last_pass_;
  double bytes_ = 0;
  float logit_;
};

TEST(BenchParallel, DriverAdvancesEverySequenceOncePerStepInRoundsOfTheBatchLimit) {
  ModelBenchArgs a = parallel_args();
  a.parallel = {3, 1};  // batch limit 2 below: 3 sequences take two rounds (2 + 1)
  a.n_gen = 4;
  a.reps = 2;
  a.depths = {10};
  a.placements = {"host"};
  BenchDevice d = h200_like();
  d.kv_budget = 1000;
  std::map<int, int> passes;
  d.open_parallel = [&](const std::string&, const std::string&, int n, int64_t n_ctx, uint64_t budget) {
    EXPECT_EQ(n, 3);
    EXPECT_EQ(n_ctx, parallel_context(10, 2, 4, 2));
    EXPECT_EQ(budget, 1000u / 3);
    auto g = std::make_unique<FakeGroup>(n, 2, n_ctx);
    g->batch_sizes = &passes;
    return std::unique_ptr<ParallelGroup>(std::move(g));
  };
  const model::ModelConfig c = tiny_config();
  BenchRun run;
  run.device = &d;
  run_parallel_rows(a, d, c, run);
  ASSERT_EQ(run.rows.size(), 2u);
  ASSERT_EQ(run.fills.size(), 1u);
  EXPECT_EQ(run.fills[0].fill_s.size(), 3u);
  EXPECT_EQ(run.fills[0].fill_tokens, 10);
  EXPECT_EQ(run.batch_limit, 2);
  const BenchRow& one = run.rows[0];
  const BenchRow& three = run.rows[1];
  EXPECT_EQ(one.label(), "tg4 @ d10 x1");
  EXPECT_EQ(three.label(), "tg4 @ d10 x3");
  EXPECT_EQ(one.rounds, 1);
  EXPECT_EQ(three.rounds, 2);
  EXPECT_EQ(three.ms.size(), 2u);
  ASSERT_EQ(three.seq_tokens.size(), 3u);
  for (const auto& t : three.seq_tokens) {
    ASSERT_EQ(t.size(), 8u);  // 2 reps x 4 timed steps
    // Each step fed the token sampled by the last (the fake samples token + 1); between the
    // repetitions one untimed warm-up step.
    for (size_t i = 1; i < t.size(); ++i) EXPECT_EQ(t[i], t[i - 1] + (i == 4 ? 2 : 1)) << i;
  }
  // The first row (sequence 0 alone) starts at the fill; the second's shortest sequence is still at it.
  EXPECT_EQ(one.depth_start[0], 11);  // 10 filled + the warm-up step
  EXPECT_EQ(three.depth_start[0], 11);
  // Floor: the fake's history bytes per step over H2D, plus two rounds of weights.
  EXPECT_GT(three.history_bytes_per_token, 0);
  EXPECT_NEAR(three.floor_ms, 2 * 3.0e9 / 4.6e12 * 1e3 + three.history_bytes_per_token / 55e9 * 1e3, 1e-9);
  EXPECT_NEAR(three.weight_floor_ms + three.history_floor_ms, three.floor_ms, 1e-12);
  // A step of 3 sequences reads all three histories: about 3x one sequence's step at the same depth.
  EXPECT_GT(three.history_bytes_per_token, 2.5 * one.history_bytes_per_token);
  EXPECT_EQ(three.seq_gpu_budget, 1000u / 3);
  // Forward passes: x1, 2 reps x (warm-up + 4 steps) + the check step, of one sequence each; x3, as many
  // steps of two rounds (2 + 1 sequences).
  EXPECT_EQ(passes, (std::map<int, int>{{1, 11 + 11}, {2, 11}}));
}

TEST(BenchParallel, DriverChecksEverySequencesLogits) {
  ModelBenchArgs a = parallel_args();
  a.parallel = {2};
  a.n_gen = 1;
  a.reps = 1;
  a.depths = {0};
  a.placements = {"host"};
  BenchDevice d = h200_like();
  d.open_parallel = [](const std::string&, const std::string&, int n, int64_t n_ctx, uint64_t) {
    return std::unique_ptr<ParallelGroup>(std::make_unique<FakeGroup>(n, 8, n_ctx, std::nanf("")));
  };
  const model::ModelConfig c = tiny_config();
  BenchRun run;
  run.device = &d;
  expect_error([&] { run_parallel_rows(a, d, c, run); }, "sequence 0: after tg1 x2 logit 1 of 2 is nan (not finite)");
}

TEST(BenchParallel, ReportHasTheRowsFloorAndFills) {
  BenchDevice d = h200_like();
  d.name = "fake";
  d.kv_budget = 123;
  BenchRun run;
  run.model_path = "m.gguf";
  run.device = &d;
  run.parallel = true;
  run.batch_limit = 8;
  BenchRow r;
  r.kind = "tg";
  r.n_tokens = 2;
  r.depth = 64;
  r.n_seqs = 16;
  r.rounds = 2;
  r.format = "bf16";
  r.placement = r.requested = "host";
  r.ms = {10.0};
  r.floor_ms = 4.0;
  r.seq_tokens.assign(16, {1, 2});
  run.rows.push_back(r);
  ParallelFill f;
  f.format = "bf16";
  f.requested = f.placement = "host";
  f.depth = 64;
  f.fill_tokens = 64;
  f.fill_s.assign(16, 0.5);
  run.fills.push_back(f);
  const std::string md = markdown_table(run);
  EXPECT_NE(md.find("| bf16 | host | tg2 @ d64 x16 | 16 | 2 | 3200.00 ± 0.00 | 200.00 | 5.000 | 4.000 | 1.25 |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("rounds of at most 8"), std::string::npos) << md;
  EXPECT_NE(md.find("16 sequences (host)"), std::string::npos) << md;
  EXPECT_NE(md.find("in 8.0 s (128 tokens/s)"), std::string::npos) << md;
  const nlohmann::json j = nlohmann::json::parse(json_report(run));
  EXPECT_TRUE(j["parallel"].get<bool>());
  EXPECT_EQ(j["rows"][0]["test"], "tg2 @ d64 x16");
  EXPECT_EQ(j["rows"][0]["n_seqs"], 16);
  EXPECT_EQ(j["rows"][0]["rounds"], 2);
  EXPECT_DOUBLE_EQ(j["rows"][0]["tokens_per_s_mean"].get<double>(), 3200.0);
  EXPECT_DOUBLE_EQ(j["rows"][0]["floor_ratio"].get<double>(), 1.25);
  EXPECT_EQ(j["rows"][0]["seq_tokens"].size(), 16u);
  EXPECT_EQ(j["fills"][0]["fill_s"].size(), 16u);
  EXPECT_EQ(j["kv_budget_bytes"], 123);
}

}  // namespace
}  // namespace activekv::cli
