// One request as the scheduler runs it and the HTTP thread answering it
// watches it: the prompt and limits (fixed at creation), the completion's
// text as it grows (text_stream.h), and how it ended. The scheduler thread
// writes, the HTTP thread waits and reads; a mutex and a condition variable
// join them. Cancelling (the client went away) is a flag the scheduler reads
// every tick: it then frees the request's pages.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "activekv/model/sampler.h"
#include "text_stream.h"

namespace activekv::serve {

using Clock = std::chrono::steady_clock;

class Job {
 public:
  Job(std::vector<int32_t> prompt, int64_t max_tokens, model::SamplerParams sampling, std::vector<std::string> stop);

  const std::vector<int32_t>& prompt() const { return prompt_; }
  int64_t max_tokens() const { return max_tokens_; }
  const model::SamplerParams& sampling() const { return sampling_; }
  Clock::time_point arrival() const { return arrival_; }

  /// What the HTTP side sees at one look.
  struct Update {
    /// New text since the last look, one entry per token that released text
    /// (whole UTF-8 characters), so a stream sends a chunk per token however
    /// late its thread looks.
    std::vector<std::string> pieces;
    bool finished = false;
    std::string finish_reason;   ///< "stop" or "length" once finished without error
    std::string error;           ///< non-empty: the request failed inside the server
    int64_t completion_tokens = 0;
  };
  /// Waits until there is new text or the job has ended, at most `timeout`.
  Update wait(std::chrono::milliseconds timeout);

  /// The client is gone: the scheduler drops the job at its next tick.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  // Scheduler side.
  /// Appends a generated token's text; true if a stop string ended the completion.
  bool push_token(const std::string& piece);
  void finish(const std::string& reason);
  void fail(const std::string& error);

 private:
  const std::vector<int32_t> prompt_;
  const int64_t max_tokens_;
  const model::SamplerParams sampling_;
  const Clock::time_point arrival_ = Clock::now();
  std::atomic<bool> cancelled_{false};

  std::mutex mu_;
  std::condition_variable cv_;
  TextStream stream_;
  std::vector<std::string> pieces_;  // released by the stream, not yet looked at
  int64_t tokens_ = 0;
  bool finished_ = false;
  std::string reason_, error_;
};

}  // namespace activekv::serve
