// See scheduler.h.
#include "scheduler.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>

#include "api_error.h"
#include "memory.h"

namespace activekv::serve {

struct Scheduler::Running {
  std::shared_ptr<Job> job;
  std::unique_ptr<Session> session;
  uint64_t bytes = 0;         // its history's host bytes (counted against the budget)
  size_t prefilled = 0;       // prompt tokens appended so far
  int64_t generated = 0;      // tokens sampled and sent (end of text not counted)
  Clock::time_point last_token;
  bool done = false;
};

Scheduler::Scheduler(Backend& backend, const Tokenizer& tok, const SchedulerOptions& o, Metrics& metrics)
    : backend_(backend), tok_(tok), opt_(o), metrics_(metrics), budget_(backend.prefill_chunk(), o.itl_target_s),
      // OpenMP's thread count is per thread: the scheduler's forward passes
      // (the CPU attention kernels) take the one set where the server was
      // made (--threads), not the process default.
      thread_([this, threads = omp_get_max_threads()] {
        omp_set_num_threads(threads);
        loop();
      }) {}

Scheduler::~Scheduler() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (auto& j : waiting_) j->fail("the server is shutting down");
  for (auto& r : running_) r->job->fail("the server is shutting down");
}

uint64_t Scheduler::history_bytes(int64_t n_ctx) const { return backend_.history_bytes(n_ctx); }

void Scheduler::submit(std::shared_ptr<Job> job) {
  const int64_t n_ctx = int64_t(job->prompt().size()) + job->max_tokens();
  const uint64_t bytes = history_bytes(n_ctx);
  if (opt_.host_kv_budget > 0 && bytes > opt_.host_kv_budget)
    throw ApiError::bad_request(fmt::format("a history of {} tokens needs {} of KV memory, over the server's "
                                            "--host-kv-mem of {}; ask for fewer max_tokens",
                                            n_ctx, cli::describe_bytes(bytes), cli::describe_bytes(opt_.host_kv_budget)),
                                "max_tokens");
  {
    std::lock_guard lock(mu_);
    if (!fatal_.empty())
      throw ApiError(503, "the server can run no more requests: " + fatal_, "service_unavailable", "", "server_error");
    if (int(waiting_.size()) >= opt_.max_queue)
      throw ApiError(429, fmt::format("the queue is full ({} requests waiting); retry later", waiting_.size()),
                     "rate_limit_error", "", "rate_limit_exceeded");
    waiting_.push_back(std::move(job));
    metrics_.waiting = int64_t(waiting_.size());
  }
  cv_.notify_all();
}

void Scheduler::loop() {
  for (;;) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || (fatal_.empty() && (!waiting_.empty() || !running_.empty())); });
      if (stop_) return;
    }
    try {
      drop_cancelled();
      admit();
      prefill_tick();
      decode_all();
    } catch (const std::exception& e) {
      // Each request's own work fails it alone (its catch); what escapes
      // to here is the tick's, so the requests it was running fail and the
      // server goes on (an exception leaving the thread would end the process).
      for (auto& r : running_)
        if (!r->done) fail(*r, std::string("internal error: ") + e.what());
    }
    remove_done();
    update_gauges();
  }
}

void Scheduler::drop_cancelled() {
  {
    std::lock_guard lock(mu_);
    std::erase_if(waiting_, [&](const std::shared_ptr<Job>& j) {
      if (j->cancelled()) ++metrics_.finished_abort;
      return j->cancelled();
    });
  }
  for (auto& r : running_) {
    if (r->job->cancelled() && !r->done) {
      r->job->finish("abort");
      r->done = true;
      ++metrics_.finished_abort;
    }
  }
  remove_done();
}

void Scheduler::admit() {
  for (;;) {
    std::shared_ptr<Job> job;
    uint64_t bytes = 0;
    {
      std::lock_guard lock(mu_);
      if (waiting_.empty() || int(running_.size()) >= opt_.max_seqs) return;
      bytes = history_bytes(int64_t(waiting_.front()->prompt().size()) + waiting_.front()->max_tokens());
      if (opt_.host_kv_budget > 0 && running_bytes_ + bytes > opt_.host_kv_budget) return;  // waits for room
      job = std::move(waiting_.front());
      waiting_.pop_front();
    }
    auto r = std::make_unique<Running>();
    r->job = job;
    r->bytes = bytes;
    try {
      const int64_t n_ctx = int64_t(job->prompt().size()) + job->max_tokens();
      r->session = backend_.open(n_ctx, job->sampling());
    } catch (const std::exception& e) {  // e.g. no memory for its page store, its GPU budget: it alone fails
      job->fail(e.what());
      ++metrics_.failed;
      if (const std::string why = backend_.broken(); !why.empty()) return enter_fatal(why);  // unless nothing can run
      continue;
    }
    running_bytes_ += bytes;
    running_.push_back(std::move(r));
  }
}

bool Scheduler::decoding() const {
  return std::any_of(running_.begin(), running_.end(),
                     [](const auto& r) { return !r->done && r->prefilled == r->job->prompt().size(); });
}

void Scheduler::prefill_tick() {
  // The tick's budget of prompt tokens: the backend's prefill_chunk, less
  // while others decode when an ITL target is set (prefill_budget.h).
  const size_t budget = size_t(budget_.tokens(decoding()));
  const Clock::time_point t0 = Clock::now();
  const size_t n = backend_.batches_prefill() ? prefill_batched(budget) : prefill_one(budget);
  budget_.prefilled(int(n), std::chrono::duration<double>(Clock::now() - t0).count());
  metrics_.prefill_budget_tokens = int64_t(budget);
}

size_t Scheduler::prefill_batched(size_t budget) {
  // The budget handed out in admission order: several short prompts share
  // one pass (the weights read once), a long one takes the whole budget, as
  // in prefill_one.
  std::vector<Running*> owners;
  std::vector<PrefillPiece> pieces;
  size_t total = 0;
  for (auto& r : running_) {
    const auto& prompt = r->job->prompt();
    if (budget == 0) break;
    if (r->done || r->prefilled == prompt.size()) continue;
    const size_t n = std::min(prompt.size() - r->prefilled, budget);
    pieces.push_back({r->session.get(), std::span(prompt).subspan(r->prefilled, n), r->prefilled + n == prompt.size()});
    owners.push_back(r.get());
    budget -= n;
    total += n;
  }
  if (pieces.empty()) return 0;
  try {
    backend_.prefill_batch(pieces);
  } catch (const std::exception&) {  // nothing appended: each alone, and only those that throw again fail
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (owners[i]->done) continue;  // failed with the server (enter_fatal) by an earlier retry
      try {
        pieces[i].session->prefill(pieces[i].tokens, pieces[i].last);
      } catch (const std::exception& e) {
        fail(*owners[i], e.what());
      }
    }
  }
  for (size_t i = 0; i < pieces.size(); ++i)
    if (!owners[i]->done) prefilled(*owners[i], pieces[i].tokens.size());
  return total;
}

size_t Scheduler::prefill_one(size_t budget) {
  for (auto& r : running_) {
    const auto& prompt = r->job->prompt();
    if (r->done || r->prefilled == prompt.size()) continue;
    const size_t n = std::min(prompt.size() - r->prefilled, budget);
    try {
      r->session->prefill(std::span(prompt).subspan(r->prefilled, n), r->prefilled + n == prompt.size());
    } catch (const std::exception& e) {
      fail(*r, e.what());
      return 0;  // not a measure of the rate
    }
    prefilled(*r, n);
    return n;  // one piece per tick: the decoding requests are not held up longer
  }
  return 0;
}

void Scheduler::prefilled(Running& r, size_t n) {
  try {
    if (opt_.sync_conversion) r.session->wait_conversions();
  } catch (const std::exception& e) {
    fail(r, e.what());
    return;
  }
  r.prefilled += n;
  if (r.prefilled == r.job->prompt().size()) metrics_.prompt_tokens += r.prefilled;
}

void Scheduler::decode_all() {
  // The whole of it (sampling, text out, the step) is what a decoding request waits each tick.
  const Clock::time_point t0 = Clock::now();
  const bool any = decoding();
  std::vector<Running*> batch;
  std::vector<int32_t> tokens;
  for (auto& rp : running_) {
    Running& r = *rp;
    if (r.done || r.prefilled < r.job->prompt().size()) continue;
    const int32_t id = r.session->sample();
    if (tok_.is_end_of_generation(id)) {
      finish(r, "stop");
      continue;
    }
    const Clock::time_point now = Clock::now();
    const std::chrono::duration<double> since = now - (r.generated == 0 ? r.job->arrival() : r.last_token);
    (r.generated == 0 ? metrics_.ttft : metrics_.itl).observe(since.count());
    r.last_token = now;
    ++r.generated;
    ++metrics_.generation_tokens;
    if (r.job->push_token(tok_.token_to_piece(id))) {
      finish(r, "stop");
    } else if (r.generated >= r.job->max_tokens()) {
      finish(r, "length");
    } else {
      batch.push_back(&r);
      tokens.push_back(id);
    }
  }
  if (!batch.empty()) step(batch, tokens);
  if (any) budget_.decoded(std::chrono::duration<double>(Clock::now() - t0).count());
}

void Scheduler::step(std::vector<Running*>& batch, std::vector<int32_t>& tokens) {
  const size_t group = size_t(std::max(1, backend_.max_batch()));
  // fatal_ is written on this thread only (enter_fatal): read without the lock.
  for (size_t i = 0; i < batch.size() && fatal_.empty(); i += group) {
    const size_t n = std::min(group, batch.size() - i);
    step_group(std::span(batch).subspan(i, n), std::span(tokens).subspan(i, n));
  }
  ++metrics_.decode_steps;
  for (Running* r : batch) {
    if (opt_.sync_conversion && !r->done) r->session->wait_conversions();
    metrics_.history_bytes_read.fetch_add(r->session->take_bytes_read());
  }
}

// One batched step of at most max_batch requests. A step that throws is
// retried one request at a time; only the requests that throw again fail.
void Scheduler::step_group(std::span<Running* const> group, std::span<const int32_t> tokens) {
  std::vector<Session*> sessions;
  for (Running* r : group) sessions.push_back(r->session.get());
  try {
    backend_.step_batch(sessions, tokens);
  } catch (const std::exception&) {
    for (size_t i = 0; i < group.size(); ++i) {
      if (group[i]->done) continue;  // failed with the server (enter_fatal) by an earlier retry
      try {
        group[i]->session->step(tokens[i]);
      } catch (const std::exception& e) {
        fail(*group[i], e.what());
      }
    }
  }
}

void Scheduler::finish(Running& r, const std::string& reason) {
  r.job->finish(reason);
  r.done = true;
  ++(reason == "length" ? metrics_.finished_length : metrics_.finished_stop);
  const std::chrono::duration<double> e2e = Clock::now() - r.job->arrival();
  metrics_.e2e.observe(e2e.count());
}

void Scheduler::fail(Running& r, const std::string& error) {
  r.job->fail(error);
  r.done = true;
  ++metrics_.failed;
  bool first = false;
  {
    std::lock_guard lock(mu_);
    first = fatal_.empty();
  }
  if (first) {
    if (const std::string why = backend_.broken(); !why.empty()) enter_fatal(why);
  }
}

// The backend can run nothing more (a lost CUDA context): retrying would
// answer every request 500 forever while /health said 200. Every request
// fails with the reason, new ones get 503, and the server is told to stop.
void Scheduler::enter_fatal(const std::string& why) {
  std::deque<std::shared_ptr<Job>> waiting;
  {
    std::lock_guard lock(mu_);
    fatal_ = why;
    waiting.swap(waiting_);
  }
  const std::string msg = "the server can run no more requests: " + why;
  for (auto& j : waiting) j->fail(msg);
  for (auto& r : running_) {
    if (r->done) continue;
    r->job->fail(msg);
    r->done = true;
    ++metrics_.failed;
  }
  metrics_.failed += uint64_t(waiting.size());
  if (opt_.on_fatal) opt_.on_fatal(why);
}

void Scheduler::remove_done() {
  // Destroying a Running frees its session: its pages go back at once.
  std::erase_if(running_, [&](const std::unique_ptr<Running>& r) {
    if (r->done) running_bytes_ -= r->bytes;
    return r->done;
  });
}

void Scheduler::update_gauges() {
  metrics_.running = int64_t(running_.size());
  metrics_.kv_host_bytes = int64_t(running_bytes_);
  int64_t gpu = 0;
  for (const auto& r : running_)
    if (r->session) gpu += int64_t(r->session->gpu_bytes());
  metrics_.kv_gpu_bytes = gpu;
  std::lock_guard lock(mu_);
  metrics_.waiting = int64_t(waiting_.size());
}

}  // namespace activekv::serve
