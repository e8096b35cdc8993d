// GPU tests: GpuSampler (activekv/cuda/sampling.h) against the CPU Sampler
// (activekv/model/sampler.h) token for token, on fresh random logits each
// draw: greedy on many vectors with ties; temperature / top-k / top-p over
// real vocab sizes (SmolLM2 49152, Qwen2 151936, Gemma 3 262144) with the same
// seed; argument errors. Labelled `gpu`.
//
// Why exact agreement is expected: both sort (logit desc, id asc), take the
// same k, and use the same draw (sample_rng.h); only the double sums run in
// another order and CUDA's exp differs from glibc's by an ulp, so the kept
// probabilities agree to ~1e-15 relative. A draw can only go the other way
// when u, or a nucleus mass against top_p, lies within ~1e-15 of a boundary
// (probability ~ kept x 1e-15 per draw, < 1e-9 here). The test recomputes, in
// long double, how close each disagreeing draw was to a boundary: a
// disagreement farther than 1e-12 fails; nearer ones are counted and may be at
// most 0.5 % of the draws (none are expected).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "activekv/core/error.h"
#include "activekv/cuda/sampling.h"
#include "activekv/model/sample_rng.h"
#include "activekv/model/sampler.h"
#include "device_array.h"

namespace activekv::cuda {
namespace {

using testing::DeviceArray;
using testing::Stream;

// A GpuSampler with its device logits and token, driven one draw at a time.
struct GpuRun {
  GpuSampler sampler;
  DeviceArray<float> logits;
  DeviceArray<int32_t> token{size_t(1)};
  Stream stream;

  GpuRun(int vocab, const model::SamplerParams& p) : sampler(vocab, p), logits(size_t(vocab)) {}
  int32_t sample(const std::vector<float>& l) {
    logits.upload(l);
    token.poison();  // -1: a kernel that writes nothing is caught
    sampler.sample(logits.get(), token.get(), stream.get());
    stream.sync();
    return token.download()[0];
  }
};

std::vector<float> normal_logits(int vocab, float sigma, std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.f, sigma);
  std::vector<float> l(static_cast<size_t>(vocab));
  for (auto& v : l) v = nd(rng);
  return l;
}

// Logits on a grid of `step`: ties everywhere, at the top and at the top-k cut,
// and -0.0 next to +0.0 (rounding small negatives), which must compare equal.
std::vector<float> tied_logits(int vocab, float sigma, float step, std::mt19937_64& rng) {
  std::vector<float> l = normal_logits(vocab, sigma, rng);
  for (auto& v : l) v = std::round(v / step) * step;
  return l;
}

// ---------------------------------------------------------------------------
// Greedy (temperature <= 0) and top_k = 1: model::argmax, lowest id on ties.

TEST(GpuSamplerGreedy, IsArgmaxWithTies) {
  AKV_NEED_GPU();
  std::mt19937_64 rng(7100);
  for (const int vocab : {1, 7, 4096, 49152, 151936, 262144}) {
    for (const model::SamplerParams p : {model::SamplerParams{0.0f, 40, 0.95f, 1},
                                         model::SamplerParams{-1.0f, 0, 1.0f, 2},
                                         model::SamplerParams{0.8f, 1, 0.95f, 3}}) {
      GpuRun run(vocab, p);
      for (int i = 0; i < 24; ++i) {
        std::vector<float> l;
        switch (i % 6) {
          case 0: l = normal_logits(vocab, 3.f, rng); break;
          case 1: l = tied_logits(vocab, 2.f, 1.f, rng); break;  // the maximum tied many times
          case 2: l.assign(size_t(vocab), 0.5f); break;           // all tied: id 0
          case 3:
            l = normal_logits(vocab, 1.f, rng);
            l.back() = 100.f;  // the last id
            break;
          case 4:
            l.assign(size_t(vocab), -INFINITY);
            l[size_t(rng() % size_t(vocab))] = -3.f;
            break;
          default:  // -0 and +0 tie for the maximum: the lower id wins whatever its sign
            l.assign(size_t(vocab), -1.f);
            l[size_t(vocab) / 2] = 0.0f;
            l[size_t(vocab) / 3] = -0.0f;
            break;
        }
        const int32_t want = model::argmax(l);
        ASSERT_EQ(run.sample(l), want) << "vocab " << vocab << ", vector kind " << i % 6 << ", temperature "
                                       << p.temperature << ", top_k " << p.top_k;
      }
      EXPECT_EQ(run.sampler.draws(), 24u);
    }
  }
}

// ---------------------------------------------------------------------------
// Sampling: token for token the CPU Sampler with the same seed.

// How close draw `draw` came to flipping: the distance, relative to the kept
// mass, of u from the nearest boundary of the kept candidates, and of the
// nucleus masses from top_p -- in long double, from the sampler's definition.
long double boundary_margin(const std::vector<float>& logits, const model::SamplerParams& p, uint64_t draw) {
  std::vector<int32_t> id(logits.size());
  std::iota(id.begin(), id.end(), 0);
  std::stable_sort(id.begin(), id.end(), [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
  const size_t k = p.top_k > 0 && size_t(p.top_k) < id.size() ? size_t(p.top_k) : id.size();
  std::vector<long double> prob(k);
  long double sum = 0;
  for (size_t i = 0; i < k; ++i) {
    prob[i] = std::exp((static_cast<long double>(logits[size_t(id[i])]) - logits[size_t(id[0])]) / p.temperature);
    sum += prob[i];
  }
  long double margin = INFINITY, mass = 0;
  size_t keep = k;
  for (size_t i = 0; i < k; ++i) {
    mass += prob[i] / sum;
    margin = std::min(margin, std::abs(mass - static_cast<long double>(p.top_p)));
    if (mass >= p.top_p && keep == k) keep = i + 1;
  }
  long double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += prob[i];
  const long double u = model::sample_uniform(p.seed, draw);
  long double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += prob[i];
    margin = std::min(margin, std::abs(acc / kept - u));
  }
  return margin;
}

struct SampleCase {
  const char* name;
  int vocab;
  model::SamplerParams params;
  bool tied;       // tied_logits (grid 0.25) instead of normal ones
  float sigma;     // logit spread
  int draws;
  bool diverse;    // most draws should not be the argmax (checks that sampling happened)
};

class GpuSampling : public ::testing::TestWithParam<SampleCase> {};

TEST_P(GpuSampling, SameTokensAsCpuSampler) {
  AKV_NEED_GPU();
  const SampleCase c = GetParam();
  GpuRun run(c.vocab, c.params);
  model::Sampler cpu(c.params);
  std::mt19937_64 rng(8000 + uint64_t(c.vocab) + c.params.seed);
  int near = 0, not_argmax = 0;
  for (int d = 0; d < c.draws; ++d) {
    const std::vector<float> l = c.tied ? tied_logits(c.vocab, c.sigma, 0.25f, rng) : normal_logits(c.vocab, c.sigma, rng);
    const int32_t want = cpu.sample(l);
    const int32_t got = run.sample(l);
    ASSERT_TRUE(got >= 0 && got < c.vocab) << "draw " << d << ": token " << got;
    not_argmax += want != model::argmax(l);
    if (got == want) continue;
    const long double m = boundary_margin(l, c.params, uint64_t(d));
    ASSERT_LT(m, 1e-12L) << "draw " << d << ": GPU " << got << ", CPU " << want
                         << ", nearest boundary " << double(m) << " away (relative)";
    near++;
  }
  std::printf("[measured] %s: %d draws, %d disagree (all within 1e-12 of a boundary), %d not the argmax\n", c.name,
              c.draws, near, not_argmax);
  EXPECT_LE(near, c.draws / 200) << "draws near a boundary disagree more often than expected";
  EXPECT_EQ(run.sampler.draws(), uint64_t(c.draws));
  if (c.diverse) EXPECT_GT(not_argmax, c.draws / 10) << "sampling looks greedy";
}

INSTANTIATE_TEST_SUITE_P(
    Params, GpuSampling,
    ::testing::Values(
        SampleCase{"default_smollm2", 49152, {0.8f, 40, 0.95f, 42}, false, 3.f, 300, true},
        SampleCase{"all_candidates", 49152, {1.0f, 0, 1.0f, 7}, false, 2.f, 200, true},
        SampleCase{"nucleus_only_qwen2", 151936, {0.7f, 0, 0.9f, 11}, false, 3.f, 150, true},
        SampleCase{"top_k_5000_gemma3", 262144, {1.2f, 5000, 0.99f, 13}, false, 2.f, 100, true},
        SampleCase{"ties_top_k", 32000, {0.8f, 40, 0.95f, 17}, true, 2.f, 300, true},
        SampleCase{"ties_all", 32000, {1.0f, 0, 1.0f, 19}, true, 1.f, 200, true},
        SampleCase{"near_greedy", 49152, {0.05f, 0, 0.95f, 23}, false, 3.f, 100, false},
        SampleCase{"hot_top_k_100", 49152, {50.f, 100, 1.0f, 29}, false, 3.f, 200, true},
        SampleCase{"top_k_over_vocab", 1000, {1.0f, 2000, 0.5f, 31}, false, 1.f, 300, true},
        SampleCase{"tiny_vocab", 7, {1.0f, 0, 1.0f, 37}, false, 1.f, 500, true},
        SampleCase{"vocab_1", 1, {1.0f, 0, 1.0f, 41}, false, 1.f, 20, false}),
    [](const ::testing::TestParamInfo<SampleCase>& i) { return std::string(i.param.name); });

// ---------------------------------------------------------------------------
// Cost per call, for the record (not asserted): the sort of the whole vocab
// dominates sampling.

TEST(GpuSamplerCost, PerCall) {
  AKV_NEED_GPU();
  std::mt19937_64 rng(9000);
  for (const model::SamplerParams p : {model::SamplerParams{0.0f, 40, 0.95f, 1}, model::SamplerParams{}}) {
    for (const int vocab : {49152, 151936, 262144}) {
      GpuRun run(vocab, p);
      run.logits.upload(normal_logits(vocab, 3.f, rng));
      cudaEvent_t a, b;
      testing::ck(cudaEventCreate(&a), "cudaEventCreate");
      testing::ck(cudaEventCreate(&b), "cudaEventCreate");
      const int iters = 50;
      run.sampler.sample(run.logits.get(), run.token.get(), run.stream.get());  // warm-up
      testing::ck(cudaEventRecord(a, run.stream.get()), "cudaEventRecord");
      for (int i = 0; i < iters; ++i) run.sampler.sample(run.logits.get(), run.token.get(), run.stream.get());
      testing::ck(cudaEventRecord(b, run.stream.get()), "cudaEventRecord");
      run.stream.sync();
      float ms = 0;
      testing::ck(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
      std::printf("[measured] GpuSampler %s vocab %d: %.1f us per call\n",
                  p.temperature <= 0 ? "greedy" : "temperature 0.8 top-k 40 top-p 0.95", vocab, 1e3 * ms / iters);
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
  }
}

// ---------------------------------------------------------------------------

TEST(GpuSamplerArgs, BadArgumentsThrow) {
  AKV_NEED_GPU();
  EXPECT_THROW(GpuSampler(0, model::SamplerParams{}), InvalidArgument);
  EXPECT_THROW(GpuSampler(100, model::SamplerParams{1.0f, 0, 0.0f, 1}), InvalidArgument);
  EXPECT_THROW(GpuSampler(100, model::SamplerParams{1.0f, 0, 1.5f, 1}), InvalidArgument);
  EXPECT_THROW(GpuSampler(100, model::SamplerParams{std::nanf(""), 0, 1.0f, 1}), InvalidArgument);
  GpuRun run(100, model::SamplerParams{});
  EXPECT_THROW(run.sampler.sample(nullptr, run.token.get(), run.stream.get()), InvalidArgument);
  EXPECT_THROW(run.sampler.sample(run.logits.get(), nullptr, run.stream.get()), InvalidArgument);
  EXPECT_EQ(run.sampler.draws(), 0u);  // a rejected call uses no draw, as on the CPU
}

}  // namespace
}  // namespace activekv::cuda
