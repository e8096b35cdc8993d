// Next-token sampling: greedy, temperature, top-k, top-p (nucleus), seeded.
//
// Order (as llama.cpp's default chain): top-k, then softmax at temperature,
// then top-p over the sorted candidates, then a draw. temperature <= 0 means
// greedy (argmax; the lowest id wins a tie). The generator is std::mt19937_64,
// whose output sequence the C++ standard fixes, and the uniform draw uses its
// top 53 bits, so a seed gives the same tokens on every platform.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace activekv::model {

struct SamplerParams {
  float temperature = 0.8f;  ///< <= 0: greedy
  int top_k = 40;            ///< <= 0: no limit
  float top_p = 0.95f;       ///< in (0, 1]; 1 = off
  uint64_t seed = 42;
};

class Sampler {
 public:
  /// Throws InvalidArgument if top_p is outside (0, 1] or temperature is NaN.
  explicit Sampler(SamplerParams p);
  /// Picks the next token id from logits [vocab].
  int32_t sample(std::span<const float> logits);

 private:
  SamplerParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
};

/// Index of the largest logit (lowest index on ties).
int32_t argmax(std::span<const float> logits);

}  // namespace activekv::model
