// The ITL-aware prefill budget (src/serve/prefill_budget.h): its arithmetic on
// a modelled pass time, and the scheduler cutting a long prompt's pieces while
// another request decodes (a fake backend whose passes and steps sleep).
#include <gtest/gtest.h>

#include <chrono>
#include <limits>
#include <thread>

#include "activekv/core/error.h"
#include "backend.h"
#include "job.h"
#include "metrics.h"
#include "prefill_budget.h"
#include "scheduler.h"

namespace activekv::serve {
namespace {

TEST(PrefillBudget, TheWholeChunkWithoutATargetOrWithoutDecodingOrBeforeAnyPass) {
  PrefillBudget off(256, 0.0);
  off.prefilled(256, 1.0);
  off.decoded(0.5);
  EXPECT_EQ(off.tokens(true), 256);
  PrefillBudget on(256, 0.2);
  EXPECT_EQ(on.tokens(true), 256);  // nothing measured yet
  on.prefilled(256, 1.0);
  EXPECT_EQ(on.tokens(false), 256);  // nobody waits for a token
  EXPECT_LT(on.tokens(true), 256);
}

// Pass time a + b n, decode step d, target T: the budget settles at
// n* = (T - d - a) / b, where the pass and the step take T together.
TEST(PrefillBudget, SettlesWhereThePassAndTheStepTakeTheTarget) {
  const double a = 0.05, b = 0.001, d = 0.1, T = 0.25;  // n* = 100 tokens
  PrefillBudget budget(256, T);
  budget.prefilled(256, a + b * 256);  // the first pass, before anyone decoded: the whole chunk
  int n = 0;
  for (int tick = 0; tick < 60; ++tick) {
    budget.decoded(d);
    n = budget.tokens(true);
    budget.prefilled(n, a + b * n);
  }
  EXPECT_NEAR(n, 100, 1);
  EXPECT_NEAR(a + b * n + d, T, 0.002);
}

TEST(PrefillBudget, AStepOverTheTargetLeavesTheLeastAndTheLeastIsCappedAtTheChunk) {
  PrefillBudget budget(256, 0.1);
  budget.prefilled(256, 0.256);
  budget.decoded(0.5);  // the decode step alone takes 5x the target
  EXPECT_EQ(budget.tokens(true), 32);
  PrefillBudget small(16, 0.1);
  small.prefilled(16, 0.016);
  small.decoded(0.5);
  EXPECT_EQ(small.tokens(true), 16);
}

TEST(PrefillBudget, BadArgumentsThrowOneLine) {
  EXPECT_THROW(PrefillBudget(0, 0.1), InvalidArgument);
  EXPECT_THROW(PrefillBudget(256, -1.0), InvalidArgument);
  EXPECT_THROW(PrefillBudget(256, std::numeric_limits<double>::infinity()), InvalidArgument);
  EXPECT_THROW(PrefillBudget(256, 0.1, 0), InvalidArgument);
}

// Prefill passes sleep 0.1 ms per token, decode steps 10 ms; the chunk is 256.
class SleepySession final : public Session {
 public:
  explicit SleepySession(std::vector<int>& pieces) : pieces_(pieces) {}
  void prefill(std::span<const int32_t> piece, bool) override {
    pieces_.push_back(int(piece.size()));
    std::this_thread::sleep_for(std::chrono::microseconds(100) * piece.size());
  }
  int32_t sample() override { return 0; }  // "a", never the end of text
  void step(int32_t) override {}
  void wait_conversions() override {}
  uint64_t take_bytes_read() override { return 0; }

 private:
  std::vector<int>& pieces_;
};

class SleepyBackend final : public Backend {
 public:
  const model::ModelConfig& config() const override { return config_; }
  std::string describe() const override { return "sleepy"; }
  int prefill_chunk() const override { return 256; }
  int max_batch() const override { return 8; }
  uint64_t history_bytes(int64_t) const override { return 1; }
  std::unique_ptr<Session> open(int64_t, const model::SamplerParams&) override {
    return std::make_unique<SleepySession>(pieces[opened++]);
  }
  void step_batch(std::span<Session* const>, std::span<const int32_t>) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::vector<int> pieces[2];  // per session, in opening order: its prompt pieces
  int opened = 0;

 private:
  model::ModelConfig config_;
};

Tokenizer letters() {
  Tokenizer::Vocab v;
  v.tokens = {"a", "b", "<eos>"};
  v.token_types = {1, 1, 3};
  v.eos_id = 2;
  return Tokenizer(std::move(v));
}

void wait_end(Job& j) {
  for (int i = 0; i < 1500; ++i)
    if (j.wait(std::chrono::milliseconds(20)).finished) return;
  ADD_FAILURE() << "the job did not end within 30 s";
}

// A short prompt that then decodes 150 tokens, and a 1000-token prompt behind
// it (one piece per tick: this backend does not batch prefill). With a 20 ms
// target and 10 ms steps the long prompt's pieces after its first (the whole
// chunk: nobody decoded yet) are at most (20 - 0) ms x 10 tokens/ms = 200 and
// settle near 100; sleeping longer (a loaded machine) only makes them smaller,
// never below 32. Without a target every piece is the chunk.
TEST(SchedulerPrefillBudget, ALongPromptComesInSmallerPiecesWhileAnotherRequestDecodes) {
  for (const double target : {0.02, 0.0}) {
    SleepyBackend backend;
    const Tokenizer tok = letters();
    Metrics metrics;
    SchedulerOptions so;
    so.itl_target_s = target;
    {
      Scheduler sched(backend, tok, so, metrics);
      auto decoder = std::make_shared<Job>(std::vector<int32_t>(4, 1), 150, model::SamplerParams{},
                                           std::vector<std::string>{});
      auto long_prompt = std::make_shared<Job>(std::vector<int32_t>(1000, 1), 1, model::SamplerParams{},
                                               std::vector<std::string>{});
      sched.submit(decoder);
      sched.submit(long_prompt);
      wait_end(*long_prompt);
      wait_end(*decoder);
    }
    const std::vector<int>& p = backend.pieces[1];
    ASSERT_GE(p.size(), 2u) << "target " << target;
    int total = 0;
    for (int n : p) total += n;
    EXPECT_EQ(total, 1000);
    for (size_t i = 1; i + 1 < p.size(); ++i) {  // the last piece is what was left
      if (target > 0) {
        EXPECT_LE(p[i], 200) << "piece " << i;
        EXPECT_GE(p[i], 32) << "piece " << i;
      } else {
        EXPECT_EQ(p[i], 256) << "piece " << i;
      }
    }
  }
}

}  // namespace
}  // namespace activekv::serve
