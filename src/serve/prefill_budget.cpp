// See prefill_budget.h.
#include "prefill_budget.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "activekv/core/error.h"

namespace activekv::serve {
namespace {

constexpr double kNewest = 0.3;  // weight of the newest measurement in the running averages

double blend(double avg, double x) { return avg > 0 ? (1 - kNewest) * avg + kNewest * x : x; }

}  // namespace

PrefillBudget::PrefillBudget(int chunk, double itl_target_s, int min_tokens)
    : chunk_(chunk), min_tokens_(std::min(min_tokens, chunk)), target_s_(itl_target_s) {
  if (chunk < 1) throw InvalidArgument(fmt::format("prefill budget: the chunk must be >= 1 token, got {}", chunk));
  if (!(itl_target_s >= 0) || std::isinf(itl_target_s))
    throw InvalidArgument(fmt::format("prefill budget: the ITL target must be >= 0 seconds, got {}", itl_target_s));
  if (min_tokens < 1)
    throw InvalidArgument(fmt::format("prefill budget: min_tokens must be >= 1, got {}", min_tokens));
}

int PrefillBudget::tokens(bool decoding) const {
  if (!decoding || target_s_ == 0 || rate_ == 0) return chunk_;
  const double n = std::floor((target_s_ - decode_s_) * rate_);  // may be negative: the decode step alone is over
  return int(std::clamp(n, double(min_tokens_), double(chunk_)));
}

void PrefillBudget::prefilled(int n, double seconds) {
  if (n > 0 && seconds > 0) rate_ = blend(rate_, double(n) / seconds);
}

void PrefillBudget::decoded(double seconds) {
  if (seconds > 0) decode_s_ = blend(decode_s_, seconds);
}

}  // namespace activekv::serve
