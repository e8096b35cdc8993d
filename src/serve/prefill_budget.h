// How many prompt tokens one scheduler tick may prefill while other requests
// decode, so that their inter-token latency (ITL) stays near a target.
//
// A decoding request waits one whole tick for its next token: the tick's
// prefill pass, then the decode step of every running request. With a target
// T (seconds) the prefill pass gets what the decode step leaves:
//   tokens = clamp(floor((T - d) * r), min_tokens, chunk)
// where d is the decode step's time and r the prefill rate in prompt tokens
// per second, both running averages of what this scheduler measured (ticks
// of its own passes; exponential weights of 0.3 for the newest). A pass of n
// tokens costs about a + b n (the weights are read once per pass, a), so its
// measured rate n / (a + b n) falls with n: the feedback settles where the
// pass takes T - d (the fixed point of n -> (T - d) n / (a + b n)), from above
// or below. Chunked prefill in the manner of Sarathi-Serve's stall-free
// batching (Agrawal et al., OSDI 2024), with a measured rather than a
// profiled token budget.
//
// With no target (0), nobody decoding, or no pass measured yet: the whole
// chunk, the scheduler's behaviour without it (time to first token first).
// Not thread-safe: the scheduler's thread alone.
#pragma once

namespace activekv::serve {

class PrefillBudget {
 public:
  /// `chunk`: the backend's prefill_chunk (tokens, >= 1); `itl_target_s`:
  /// the target ITL in seconds (0: off); `min_tokens`: the least a tick
  /// prefills while others decode (prompts still progress when the decode
  /// step alone takes the target), capped at chunk. Throws InvalidArgument
  /// for chunk < 1, a negative or non-finite target, or min_tokens < 1.
  PrefillBudget(int chunk, double itl_target_s, int min_tokens = 32);

  /// Prompt tokens the next tick may prefill; `decoding`: whether any request
  /// will take a decode step in the same tick.
  int tokens(bool decoding) const;
  /// A prefill pass of `n` prompt tokens (all its pieces) took `seconds`.
  void prefilled(int n, double seconds);
  /// A tick's decode step (every decoding request) took `seconds`.
  void decoded(double seconds);

 private:
  int chunk_, min_tokens_;
  double target_s_;
  double rate_ = 0, decode_s_ = 0;  // running averages, 0 until measured: prompt tokens/s of a pass, s of a step
};

}  // namespace activekv::serve
