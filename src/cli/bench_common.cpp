// What `activekv bench`'s drivers share (bench_model.h): progress lines and
// the finiteness check of a row's logits.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "activekv/core/error.h"
#include "bench_model.h"

namespace activekv::cli {

void bench_stage(const std::string& what) {
  fmt::print(stderr, "bench: {}\n", what);
  std::fflush(stderr);
}

void check_finite_logits(const std::vector<float>& logits, const std::string& where, const std::string& label) {
  const auto bad = std::find_if(logits.begin(), logits.end(), [](float x) { return !std::isfinite(x); });
  if (bad != logits.end())
    throw Error(fmt::format("bench: {}: after {} logit {} of {} is {} (not finite): the model's weights or a kernel "
                            "are broken; nothing was timed on it",
                            where, label, bad - logits.begin(), logits.size(), *bad));
}

}  // namespace activekv::cli
