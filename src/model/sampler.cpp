#include "activekv/model/sampler.h"

#include <algorithm>
#include <cmath>

#include "activekv/core/error.h"
#include "activekv/model/sample_rng.h"

namespace activekv::model {

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[size_t(best)]) best = int32_t(i);
  }
  return best;
}

Sampler::Sampler(SamplerParams p) : p_(p) { p_.validate(); }

int32_t Sampler::sample(std::span<const float> logits) {
  if (logits.empty()) throw InvalidArgument("sampler: empty logits");
  const uint64_t draw = draws_++;  // every call counts, greedy too: the GPU sampler counts alike
  if (p_.temperature <= 0.0f) return argmax(logits);

  cand_.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) cand_[i] = {logits[i], int32_t(i)};
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t k = cand_.size();
  if (p_.top_k > 0 && size_t(p_.top_k) < k) k = size_t(p_.top_k);
  std::partial_sort(cand_.begin(), cand_.begin() + std::ptrdiff_t(k), cand_.end(), by_logit);
  cand_.resize(k);

  // Softmax at temperature over the k candidates (in double for stable sums).
  std::vector<double> prob(k);
  const double top = cand_[0].first;
  double sum = 0.0;
  for (size_t i = 0; i < k; ++i) {
    prob[i] = std::exp((double(cand_[i].first) - top) / p_.temperature);
    sum += prob[i];
  }
  // Nucleus: keep the smallest prefix whose mass reaches top_p.
  size_t keep = k;
  double mass = 0.0;
  for (size_t i = 0; i < k; ++i) {
    mass += prob[i] / sum;
    if (mass >= double(p_.top_p)) {
      keep = i + 1;
      break;
    }
  }
  double kept_sum = 0.0;
  for (size_t i = 0; i < keep; ++i) kept_sum += prob[i];
  const double u = sample_uniform(p_.seed, draw) * kept_sum;
  double acc = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    acc += prob[i];
    if (u < acc) return cand_[i].second;
  }
  return cand_[keep - 1].second;
}

}  // namespace activekv::model
