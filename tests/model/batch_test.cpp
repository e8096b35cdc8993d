// LlamaModel::forward_batch (a server's decode step over several sequences)
// against each sequence run alone with forward(): same logits, and every
// sequence's history holds its own tokens only.
//
// The default model's matrices are Q4_1 and Q8_0, multiplied in their blocks
// (model/quant_matmul.h): up to 16 rows each dot is summed in a fixed order
// whatever the rows beside it, so the logits must be bitwise equal; past 16
// rows (and with ACTIVEKV_CPU_WEIGHTS=f32 past 8: sgemv per row, then one
// sgemm) the projections run through sgemm, which may sum in another order:
// the bounds are about 3x what was measured. Several prompts in one pass (a
// server's prefill tick) likewise.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "activekv/model/sampler.h"
#include "model_fixture.h"

namespace activekv {
namespace {

// One sequence: its own store, history and last logits.
struct Seq {
  std::unique_ptr<kv::PageStore> store;
  std::unique_ptr<kv::SequenceKv> kv;
  std::vector<float> logits;
};

Seq open_seq(model::LlamaModel& m, const std::vector<int32_t>& prompt) {
  Seq s;
  s.store = std::make_unique<kv::PageStore>(m.kv_shape(16));  // small pages: the steps cross page boundaries
  s.kv = std::make_unique<kv::SequenceKv>(*s.store);
  s.logits = m.prefill(prompt, *s.kv);
  return s;
}

// Distinct prompts of distinct lengths: token ids i*37+j+11 (all in the vocabulary).
std::vector<int32_t> prompt_of(int i) {
  std::vector<int32_t> p;
  for (int j = 0; j < 5 + 3 * i; ++j) p.push_back(int32_t((i * 37 + j * 101 + 11) % 40000));
  return p;
}

// Runs `steps` greedy decode steps of `n` sequences batched and alone; returns
// the largest |logit difference| and checks both chose the same tokens.
double batched_vs_alone(int n, int steps) {
  model::LlamaModel& m = testing::shared_model();
  const size_t vocab = size_t(m.config().vocab_size);
  std::vector<Seq> batched, alone;
  for (int i = 0; i < n; ++i) {
    batched.push_back(open_seq(m, prompt_of(i)));
    alone.push_back(open_seq(m, prompt_of(i)));
  }
  double worst = 0;
  std::vector<float> out(size_t(n) * vocab);
  for (int s = 0; s < steps; ++s) {
    std::vector<int32_t> tok(static_cast<size_t>(n));
    std::vector<model::BatchItem> items;
    for (int i = 0; i < n; ++i) {
      tok[size_t(i)] = model::argmax(batched[size_t(i)].logits);
      EXPECT_EQ(tok[size_t(i)], model::argmax(alone[size_t(i)].logits)) << "sequence " << i << " step " << s;
      items.push_back({std::span(&tok[size_t(i)], 1), batched[size_t(i)].kv.get(), nullptr});
    }
    m.forward_batch(items, out);
    for (int i = 0; i < n; ++i) {
      Seq& a = alone[size_t(i)];
      m.forward(std::span(&tok[size_t(i)], 1), *a.kv, a.logits);
      std::copy_n(out.data() + size_t(i) * vocab, vocab, batched[size_t(i)].logits.data());
      for (size_t v = 0; v < vocab; ++v)
        worst = std::max(worst, double(std::fabs(batched[size_t(i)].logits[v] - a.logits[v])));
      EXPECT_EQ(batched[size_t(i)].kv->n_tokens(), a.kv->n_tokens());
    }
  }
  return worst;
}

TEST(ForwardBatch, UpToEightRowsIsBitwiseTheSingleSequencePass) {
  EXPECT_EQ(batched_vs_alone(3, 3), 0.0);
  EXPECT_EQ(batched_vs_alone(8, 2), 0.0);
}

TEST(ForwardBatch, PastEightRowsFollowsTheSingleSequencePass) {
  const double d = batched_vs_alone(12, 3);
  std::printf("[measured] 12 sequences batched vs alone: max |dlogit| %.3g\n", d);
  // Block matrices: 0 (2026-12-05, dev VM), as quant_matmul.h specifies up to
  // 16 rows. With ACTIVEKV_CPU_WEIGHTS=f32, 6.9e-3 (2026-12-01, OpenBLAS
  // 0.3.21 OpenMP build, OMP_NUM_THREADS=2): sgemm sums in another order than
  // sgemv, so that bound stays for the fp32 arm.
  if (model::weight_format_from_env() == model::WeightFormat::f32) EXPECT_LE(d, 2e-2);
  else EXPECT_EQ(d, 0.0);
}

TEST(ForwardBatch, PastSixteenRowsFollowsTheSingleSequencePass) {
  const double d = batched_vs_alone(20, 2);
  std::printf("[measured] 20 sequences batched vs alone: max |dlogit| %.3g\n", d);
  // Past 16 rows the block matrices are dequantised and go through sgemm
  // (the prefill path), solo steps through the fused kernel: fp32 rounding
  // apart. Measured 1.14e-2 (2026-12-05, dev VM, 2 threads). Bound ~3x.
  EXPECT_LE(d, 3.5e-2);
}

// Several prompts appended in one pass (a server tick prefilling several
// requests) against each prompt alone: the last rows' logits, then greedy
// decode steps of each sequence alone from either history. Returns the
// largest |logit difference| over both.
double prompts_batched_vs_alone(const std::vector<int>& lengths, int steps) {
  model::LlamaModel& m = testing::shared_model();
  const size_t vocab = size_t(m.config().vocab_size), n = lengths.size();
  std::vector<std::vector<int32_t>> prompts;
  std::vector<Seq> batched(n), alone;
  std::vector<model::BatchItem> items;
  for (size_t i = 0; i < n; ++i) {
    std::vector<int32_t> p;
    for (int j = 0; j < lengths[i]; ++j) p.push_back(int32_t((int(i) * 53 + j * 97 + 7) % 40000));
    prompts.push_back(p);
    alone.push_back(open_seq(m, p));
    batched[i].store = std::make_unique<kv::PageStore>(m.kv_shape(16));
    batched[i].kv = std::make_unique<kv::SequenceKv>(*batched[i].store);
  }
  for (size_t i = 0; i < n; ++i) items.push_back({prompts[i], batched[i].kv.get(), nullptr});
  std::vector<float> out(n * vocab);
  m.forward_batch(items, out);
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    batched[i].logits.assign(out.begin() + std::ptrdiff_t(i * vocab), out.begin() + std::ptrdiff_t((i + 1) * vocab));
    EXPECT_EQ(batched[i].kv->n_tokens(), int64_t(prompts[i].size()));
    for (int s = 0; s <= steps; ++s) {
      for (size_t v = 0; v < vocab; ++v)
        worst = std::max(worst, double(std::fabs(batched[i].logits[v] - alone[i].logits[v])));
      const int32_t t = model::argmax(alone[i].logits);
      EXPECT_EQ(model::argmax(batched[i].logits), t) << "prompt " << i << " step " << s;
      if (s == steps) break;
      m.forward(std::span(&t, 1), *batched[i].kv, batched[i].logits);
      m.forward(std::span(&t, 1), *alone[i].kv, alone[i].logits);
    }
  }
  return worst;
}

TEST(ForwardBatch, PromptsInOnePassFollowEachPromptAlone) {
  const double d = prompts_batched_vs_alone({12, 40, 9, 33}, 3);
  std::printf("[measured] 4 prompts (12, 40, 9, 33 tokens) in one pass vs alone, then 3 steps: max |dlogit| %.3g\n", d);
  // Measured 3.4e-2 on 2026-12-03, the 2-core x86-64 dev VM (OpenBLAS 0.3.21
  // OpenMP build, OMP_NUM_THREADS=2): every prompt has more than 8 rows, so
  // both run sgemm, but OpenBLAS's sgemm is not invariant in the row count
  // (one 576x576 product: 3.4e-5 between 12 and 52 rows), and the difference
  // grows through 30 layers. Same greedy tokens here (checked above); a served
  // prompt prefilled beside others may differ from a solo run at a near-tie.
  // On 2026-12-05 (block weights, same VM): 4.2e-2 with the reference
  // attention, 5.5e-2 with the in-place prefill kernel (its rows do not
  // depend on each other; the projections' roundings land elsewhere). Bound ~3x.
  EXPECT_LE(d, 0.16);
}

TEST(ForwardBatch, RejectsBadBatchesLeavingEverySequenceUnchanged) {
  model::LlamaModel& m = testing::shared_model();
  Seq a = open_seq(m, prompt_of(0)), b = open_seq(m, prompt_of(1));
  const int64_t na = a.kv->n_tokens(), nb = b.kv->n_tokens();
  std::vector<float> out(2 * size_t(m.config().vocab_size));
  const int32_t good = 42, bad = -1;
  const model::BatchItem twice[] = {{std::span(&good, 1), a.kv.get()}, {std::span(&good, 1), a.kv.get()}};
  EXPECT_THROW(m.forward_batch(twice, out), InvalidArgument);
  const model::BatchItem bad_id[] = {{std::span(&good, 1), a.kv.get()}, {std::span(&bad, 1), b.kv.get()}};
  EXPECT_THROW(m.forward_batch(bad_id, out), InvalidArgument);
  const model::BatchItem ok[] = {{std::span(&good, 1), a.kv.get()}, {std::span(&good, 1), b.kv.get()}};
  std::vector<float> short_out(10);
  EXPECT_THROW(m.forward_batch(ok, short_out), InvalidArgument);
  EXPECT_THROW(m.forward_batch({}, out), InvalidArgument);
  EXPECT_EQ(a.kv->n_tokens(), na);
  EXPECT_EQ(b.kv->n_tokens(), nb);
  m.forward_batch(ok, out);
  EXPECT_EQ(a.kv->n_tokens(), na + 1);
  EXPECT_EQ(b.kv->n_tokens(), nb + 1);
}

}  // namespace
}  // namespace activekv
