// See job.h.
#include "job.h"

namespace activekv::serve {

Job::Job(std::vector<int32_t> prompt, int64_t max_tokens, model::SamplerParams sampling, std::vector<std::string> stop)
    : prompt_(std::move(prompt)), max_tokens_(max_tokens), sampling_(sampling), stream_(std::move(stop)) {}

Job::Update Job::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  Update u;
  cv_.wait_for(lock, timeout, [&] { return !pieces_.empty() || finished_; });
  u.pieces.swap(pieces_);
  u.finished = finished_;
  u.finish_reason = reason_;
  u.error = error_;
  u.completion_tokens = tokens_;
  return u;
}

bool Job::push_token(const std::string& piece) {
  bool stopped;
  {
    std::lock_guard lock(mu_);
    ++tokens_;
    stopped = stream_.push(piece);
    if (std::string t = stream_.take(); !t.empty()) pieces_.push_back(std::move(t));
  }
  cv_.notify_all();
  return stopped;
}

void Job::finish(const std::string& reason) {
  {
    std::lock_guard lock(mu_);
    if (std::string t = stream_.finish(); !t.empty()) pieces_.push_back(std::move(t));  // what was held back
    finished_ = true;
    reason_ = reason;
  }
  cv_.notify_all();
}

void Job::fail(const std::string& error) {
  {
    std::lock_guard lock(mu_);
    finished_ = true;
    error_ = error.empty() ? "internal error" : error;
  }
  cv_.notify_all();
}

}  // namespace activekv::serve
