// The scheduler's prefill tick against a fake backend (no model): several
// short prompts share one batched prefill pass within the chunk budget, in
// admission order; a pass that throws is retried one request at a time and
// only the request that throws again fails; a backend that does not batch
// prefill gets one request's piece per call.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <map>
#include <set>

#include "backend.h"
#include "job.h"
#include "metrics.h"
#include "api_error.h"
#include "scheduler.h"

namespace activekv::serve {
namespace {

class FakeSession final : public Session {
 public:
  FakeSession(int id, bool poisoned, std::vector<int>& solo) : id(id), poisoned(poisoned), solo_(solo) {}
  void prefill(std::span<const int32_t> piece, bool /*last*/) override {
    if (poisoned) throw Error("fake: this request's prefill fails");
    solo_.push_back(int(piece.size()));
  }
  int32_t sample() override { return 0; }  // token "a"
  void step(int32_t) override {}
  void wait_conversions() override {}
  uint64_t take_bytes_read() override { return 0; }

  const int id;
  const bool poisoned;

 private:
  std::vector<int>& solo_;  // piece sizes appended through prefill() (the backend's: outlives the session)
};

// One call of prefill_batch: (session id, piece tokens, last) per piece.
using Call = std::vector<std::tuple<int, int, bool>>;

class FakeBackend final : public Backend {
 public:
  FakeBackend(bool batches, std::set<int> poisoned, std::string broken = {})
      : batches_(batches), poisoned_(std::move(poisoned)), broken_(std::move(broken)) {}
  std::string broken() override { return broken_; }  // asked after a failure only
  const model::ModelConfig& config() const override { return config_; }
  std::string describe() const override { return "fake"; }
  int prefill_chunk() const override { return 16; }
  bool batches_prefill() const override { return batches_; }
  int max_batch() const override { return 8; }
  uint64_t history_bytes(int64_t) const override { return 1; }
  std::unique_ptr<Session> open(int64_t, const model::SamplerParams&) override {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return released_; });  // admission waits until every job is queued
    auto s = std::make_unique<FakeSession>(next_id_, poisoned_.count(next_id_) > 0, solo[next_id_]);
    ++next_id_;
    return s;
  }
  void prefill_batch(std::span<const PrefillPiece> pieces) override {
    Call c;
    bool poisoned = false;
    for (const PrefillPiece& p : pieces) {
      auto* s = static_cast<FakeSession*>(p.session);
      c.emplace_back(s->id, int(p.tokens.size()), p.last);
      poisoned |= s->poisoned;
    }
    calls.push_back(c);
    if (poisoned) throw Error("fake: a pass with a failing request");
  }
  void step_batch(std::span<Session* const>, std::span<const int32_t>) override {}

  void release() {
    std::lock_guard lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  std::vector<Call> calls;
  std::map<int, std::vector<int>> solo;  // per session id: pieces through Session::prefill

 private:
  model::ModelConfig config_;
  const bool batches_;
  const std::set<int> poisoned_;
  const std::string broken_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
  int next_id_ = 0;
};

Tokenizer letters() {
  Tokenizer::Vocab v;
  v.tokens = {"a", "b", "c", "<eos>"};
  v.token_types = {1, 1, 1, 3};
  v.eos_id = 3;
  return Tokenizer(std::move(v));
}

std::shared_ptr<Job> job_of(int prompt_tokens) {
  return std::make_shared<Job>(std::vector<int32_t>(size_t(prompt_tokens), 1), 2, model::SamplerParams{},
                               std::vector<std::string>{});
}

// Waits for the job's end; its text and error.
std::pair<std::string, std::string> outcome(Job& j) {
  std::string text;
  for (int i = 0; i < 500; ++i) {
    const Job::Update u = j.wait(std::chrono::milliseconds(20));
    for (const std::string& p : u.pieces) text += p;
    if (u.finished || !u.error.empty()) return {text, u.error};
  }
  ADD_FAILURE() << "the job did not end within 10 s";
  return {text, ""};
}

// Runs jobs of the given prompt lengths to their end; the backend's calls.
struct TickLog {
  std::vector<Call> calls;
  std::vector<std::pair<std::string, std::string>> outcomes;
  std::map<int, std::vector<int>> solo;  // per session id: pieces through Session::prefill
};
TickLog run(bool batches, const std::vector<int>& lengths, std::set<int> poisoned = {}) {
  FakeBackend backend(batches, std::move(poisoned));
  const Tokenizer tok = letters();
  Metrics metrics;
  TickLog r;
  {
    Scheduler sched(backend, tok, SchedulerOptions{}, metrics);
    std::vector<std::shared_ptr<Job>> jobs;
    for (int n : lengths) {
      jobs.push_back(job_of(n));
      sched.submit(jobs.back());
    }
    backend.release();
    for (auto& j : jobs) r.outcomes.push_back(outcome(*j));
    r.calls = backend.calls;
    r.solo = backend.solo;
  }
  return r;
}

TEST(SchedulerPrefill, ShortPromptsShareOnePassWithinTheChunkInAdmissionOrder) {
  const TickLog r = run(true, {5, 6, 9});
  // Chunk 16: 5 + 6 + the first 5 of 9 in one pass, then the last 4.
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0], (Call{{0, 5, true}, {1, 6, true}, {2, 5, false}}));
  EXPECT_EQ(r.calls[1], (Call{{2, 4, true}}));
  for (const auto& [text, error] : r.outcomes) {
    EXPECT_EQ(text, "aa");
    EXPECT_EQ(error, "");
  }
}

TEST(SchedulerPrefill, AFailingPassIsRetriedAloneAndOnlyTheFailingRequestFails) {
  const TickLog r = run(true, {4, 4, 4}, {1});
  ASSERT_GE(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0], (Call{{0, 4, true}, {1, 4, true}, {2, 4, true}}));
  EXPECT_EQ(r.solo.at(0), std::vector<int>{4});  // retried alone after the pass threw
  EXPECT_EQ(r.solo.at(2), std::vector<int>{4});
  EXPECT_EQ(r.outcomes[0], (std::pair<std::string, std::string>{"aa", ""}));
  EXPECT_EQ(r.outcomes[1].first, "");
  EXPECT_NE(r.outcomes[1].second.find("this request's prefill fails"), std::string::npos) << r.outcomes[1].second;
  EXPECT_EQ(r.outcomes[2], (std::pair<std::string, std::string>{"aa", ""}));
}

TEST(SchedulerPrefill, ABackendThatDoesNotBatchGetsOneRequestsPiecePerTick) {
  const TickLog r = run(false, {5, 20});
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.solo.at(0), std::vector<int>{5});
  EXPECT_EQ(r.solo.at(1), (std::vector<int>{16, 4}));
  for (const auto& [text, error] : r.outcomes) EXPECT_EQ(text, "aa");
}

// A failure after which the backend can run nothing more (a lost CUDA
// context): every request fails with the reason, on_fatal is called once,
// and a new request is refused with 503 -- not retried into 500s forever
// while /health said 200 (found by a review, session 23).
TEST(SchedulerFatal, ABrokenBackendFailsEveryRequestAndRefusesNewOnes) {
  FakeBackend backend(true, {1}, "fake: the context is lost");
  const Tokenizer tok = letters();
  Metrics metrics;
  std::vector<std::string> fatal_calls;
  SchedulerOptions so;
  so.on_fatal = [&](const std::string& why) { fatal_calls.push_back(why); };
  auto sched = std::make_unique<Scheduler>(backend, tok, so, metrics);
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i < 3; ++i) {
    jobs.push_back(job_of(4));
    sched->submit(jobs.back());
  }
  backend.release();
  std::vector<std::pair<std::string, std::string>> out;
  for (auto& j : jobs) out.push_back(outcome(*j));
  EXPECT_NE(out[1].second.find("this request's prefill fails"), std::string::npos) << "its own error: " << out[1].second;
  for (int i : {0, 2})
    EXPECT_NE(out[size_t(i)].second.find("the server can run no more requests: fake: the context is lost"),
              std::string::npos)
        << "request " << i << ": " << out[size_t(i)].second;
  try {
    sched->submit(job_of(4));
    ADD_FAILURE() << "a new request was queued on a broken backend";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 503);
  }
  sched.reset();  // joins its thread: on_fatal (called after the jobs failed) has returned
  ASSERT_EQ(fatal_calls.size(), 1u);
  EXPECT_EQ(fatal_calls[0], "fake: the context is lost");
  EXPECT_EQ(metrics.failed.load(), 3u);
}

}  // namespace
}  // namespace activekv::serve
