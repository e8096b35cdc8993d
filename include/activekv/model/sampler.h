// Next-token sampling: greedy, temperature, top-k, top-p (nucleus), seeded.
//
// Order (as llama.cpp's default chain): top-k, then softmax at temperature,
// then top-p over the sorted candidates, then a draw. temperature <= 0 means
// greedy (argmax; the lowest id wins a tie).
//
// The semantics, exactly (the GPU sampler of activekv/cuda/sampling.h
// implements the same steps):
//   1. candidates sorted by (logit descending, id ascending), cut to the first
//      top_k (top_k <= 0 or >= vocab: all);
//   2. p_i = exp((logit_i - logit_0) / temperature) in double, sum = sum of p_i;
//   3. nucleus: keep the smallest prefix whose mass, the running sum of
//      p_i / sum, reaches top_p (all candidates if it never does);
//   4. u = sample_uniform(seed, n) * (sum of the kept p_i), where n counts the
//      sampler's earlier calls (activekv/model/sample_rng.h); the token is
//      the first kept candidate whose running sum of p_i exceeds u (the last
//      kept one if none does).
// A seed therefore gives the same tokens on every platform and on the GPU.
// Logits must be finite: with a NaN or an infinity the token is unspecified
// (but always a valid id).
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "activekv/core/error.h"

namespace activekv::model {

struct SamplerParams {
  float temperature = 0.8f;  ///< <= 0: greedy
  int top_k = 40;            ///< <= 0: no limit
  float top_p = 0.95f;       ///< in (0, 1]; 1 = off
  uint64_t seed = 42;

  /// Throws InvalidArgument if top_p is outside (0, 1] or temperature is NaN.
  void validate() const {
    if (!(top_p > 0.0f && top_p <= 1.0f)) {
      throw InvalidArgument(fmt::format("sampler: top_p must be in (0, 1], got {}", top_p));
    }
    if (std::isnan(temperature)) throw InvalidArgument("sampler: temperature is NaN");
  }
};

class Sampler {
 public:
  /// Throws InvalidArgument for bad parameters (SamplerParams::validate).
  explicit Sampler(SamplerParams p);
  /// Picks the next token id from logits [vocab]. Throws InvalidArgument for
  /// empty logits (that call uses no draw).
  int32_t sample(std::span<const float> logits);
  /// Calls of sample() so far: the draw index the next call uses.
  uint64_t draws() const { return draws_; }

 private:
  SamplerParams p_;
  uint64_t draws_ = 0;
  std::vector<std::pair<float, int32_t>> cand_;
};

/// Index of the largest logit (lowest index on ties).
int32_t argmax(std::span<const float> logits);

}  // namespace activekv::model
