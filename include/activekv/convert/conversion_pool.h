// A small thread pool for background page conversion (SPEC §7).
//
// Jobs are tagged with an owner (e.g. one sequence's history) so that an
// owner can wait for, or cancel, its own jobs before it frees the pages they
// read. A job that throws is counted and logged, never rethrown: a page that
// fails to convert simply stays exact. The destructor runs the jobs already
// queued, then joins the threads (a clean drain).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace activekv::convert {

class ConversionPool {
 public:
  using Job = std::function<void()>;
  /// Receives one line per failed job (default: stderr).
  using LogFn = std::function<void(const std::string&)>;

  /// Starts `n_threads` workers (>= 1; throws InvalidArgument otherwise).
  explicit ConversionPool(int n_threads, LogFn log = {});
  /// Drains: finishes queued jobs, then joins.
  ~ConversionPool();
  ConversionPool(const ConversionPool&) = delete;
  ConversionPool& operator=(const ConversionPool&) = delete;

  /// Queues `job` for `owner`. Never blocks on conversion work.
  void submit(const void* owner, Job job);
  /// Drops `owner`'s queued jobs and waits for its running ones.
  void cancel(const void* owner);
  /// Waits until `owner` has no queued or running job.
  void wait(const void* owner);

  size_t completed() const;
  size_t failed() const;
  int threads() const { return int(workers_.size()); }

 private:
  struct Task {
    const void* owner;
    Job job;
  };
  void worker();

  LogFn log_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Task> queue_;
  std::unordered_map<const void*, size_t> pending_;  // queued + running, per owner
  size_t completed_ = 0, failed_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace activekv::convert
