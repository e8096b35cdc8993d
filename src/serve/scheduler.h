// The scheduler: one thread that drives the model (a Backend: the CPU path
// or the GPU runtime, backend.h) and runs every request.
//
// Requests wait in a bounded FIFO queue (past max_queue: 429) and are
// admitted, in order, while fewer than max_seqs run and the histories of the
// running ones plus the new one fit the host KV budget. Each admitted request
// gets its own history (a Session: its own page store, pages, sampler; on the
// GPU its own device pages within its share of the GPU budget) sized for
// prompt + max_tokens; it is freed the moment the request finishes or is
// cancelled. One tick of the loop:
//   1. drop cancelled requests (waiting or running), freeing their pages;
//   2. admit what fits;
//   3. prefill at most one chunk (the backend's prefill_chunk) of prompt
//      tokens, so a long prompt never stalls the running ones for more than
//      a chunk (with an ITL target, itl_target_s, fewer while others decode,
//      as the measured pass and step times allow: prefill_budget.h). On the
//      CPU path the tick's budget is shared in admission order by the
//      requests still prefilling, all in one forward pass
//      (Backend::prefill_batch: several short prompts cost about one pass);
//      on the GPU one request's piece per tick;
//   4. every decoding request samples its next token (text out to its
//      client, stop strings, end of text, max_tokens), then all that go on
//      take one batched decode step (Backend::step_batch, in groups of its
//      max_batch: the projections and FFN over all their rows at once;
//      attention over each request's own pages -- per request on the CPU,
//      one launch per layer for the group on the GPU).
// A request that throws fails alone: a batched step that throws is retried
// one request at a time, and only the requests that throw again fail.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "activekv/tokenizer/tokenizer.h"
#include "backend.h"
#include "job.h"
#include "metrics.h"
#include "prefill_budget.h"

namespace activekv::serve {

struct SchedulerOptions {
  int max_seqs = 8;                 ///< requests running at once
  int max_queue = 64;               ///< requests waiting at once; past it, 429
  uint64_t host_kv_budget = 0;      ///< bytes all running histories may hold; 0 = no limit
  /// Wait for background conversion after every prefill chunk and decode step,
  /// so a compressed format reads every full page compressed whatever the
  /// timing: deterministic outputs (tests). Off: decode never waits (generate's behaviour).
  bool sync_conversion = false;
  /// Target inter-token latency (seconds) of the decoding requests while
  /// prompts prefill: each tick's prefill is sized to leave it (prefill_budget.h).
  /// 0: every tick prefills the backend's whole prefill_chunk.
  double itl_target_s = 0;
  /// Called once, from the scheduler's thread, when the backend can run no
  /// request any more (Backend::broken), with the reason, after every
  /// request was failed with it: the server stops (a supervisor restarts it).
  std::function<void(const std::string&)> on_fatal;
};

class Scheduler {
 public:
  /// Starts the thread. `backend`, `tok` and `metrics` must outlive the scheduler.
  Scheduler(Backend& backend, const Tokenizer& tok, const SchedulerOptions& o, Metrics& metrics);
  /// Stops the thread; requests still queued or running fail ("the server is shutting down").
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  /// Queues `job`. Throws ApiError 429 when max_queue requests wait already,
  /// 400 when its history (prompt + max_tokens) alone exceeds the KV budget.
  void submit(std::shared_ptr<Job> job);
  /// Host bytes of a history of n_ctx tokens (whole pages of every layer).
  uint64_t history_bytes(int64_t n_ctx) const;

 private:
  struct Running;
  void loop();
  void drop_cancelled();
  void admit();
  bool decoding() const;  // whether a running request is past its prompt
  void prefill_tick();
  size_t prefill_batched(size_t budget);  // each returns the prompt tokens it prefilled
  size_t prefill_one(size_t budget);
  void prefilled(Running& r, size_t n);
  void decode_all();
  void step(std::vector<Running*>& batch, std::vector<int32_t>& tokens);
  void step_group(std::span<Running* const> group, std::span<const int32_t> tokens);
  void finish(Running& r, const std::string& reason);
  void fail(Running& r, const std::string& error);
  void enter_fatal(const std::string& why);  // every request fails with `why`, on_fatal, no more ticks
  void remove_done();
  void update_gauges();

  Backend& backend_;
  const Tokenizer& tok_;
  const SchedulerOptions opt_;
  Metrics& metrics_;

  std::mutex mu_;  // guards waiting_ and stop_
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> waiting_;
  bool stop_ = false;
  std::string fatal_;  // under mu_: why the backend can run nothing more ("" while it can)

  std::vector<std::unique_ptr<Running>> running_;  // the scheduler thread's alone
  uint64_t running_bytes_ = 0;
  PrefillBudget budget_;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace activekv::serve
