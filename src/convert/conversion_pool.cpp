#include "activekv/convert/conversion_pool.h"

#include <fmt/format.h>

#include <cstdio>
#include <exception>

#include "activekv/core/error.h"

namespace activekv::convert {

ConversionPool::ConversionPool(int n_threads, LogFn log) : log_(std::move(log)) {
  if (n_threads < 1) throw InvalidArgument(fmt::format("ConversionPool: {} threads", n_threads));
  if (!log_) log_ = [](const std::string& line) { fmt::print(stderr, "{}\n", line); };
  for (int i = 0; i < n_threads; ++i) workers_.emplace_back([this] { worker(); });
}

ConversionPool::~ConversionPool() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ConversionPool::submit(const void* owner, Job job) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back({owner, std::move(job)});
    pending_[owner]++;
  }
  work_cv_.notify_one();
}

void ConversionPool::cancel(const void* owner) {
  std::unique_lock lock(mu_);
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (it->owner == owner) {
      it = queue_.erase(it);
      pending_[owner]--;
    } else {
      ++it;
    }
  }
  done_cv_.wait(lock, [&] { return pending_[owner] == 0; });
  pending_.erase(owner);
}

void ConversionPool::wait(const void* owner) {
  std::unique_lock lock(mu_);
  done_cv_.wait(lock, [&] { return pending_[owner] == 0; });
}

size_t ConversionPool::completed() const {
  std::lock_guard lock(mu_);
  return completed_;
}

size_t ConversionPool::failed() const {
  std::lock_guard lock(mu_);
  return failed_;
}

void ConversionPool::worker() {
  for (;;) {
    Task task;
    {
      std::unique_lock lock(mu_);
      work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    std::string error;
    try {
      task.job();
    } catch (const std::exception& e) {
      error = e.what();
    } catch (...) {
      error = "unknown exception";
    }
    if (!error.empty()) log_(fmt::format("activekv: page conversion failed, page stays exact: {}", error));
    {
      std::lock_guard lock(mu_);
      (error.empty() ? completed_ : failed_)++;
      pending_[task.owner]--;
    }
    done_cv_.notify_all();
  }
}

}  // namespace activekv::convert
