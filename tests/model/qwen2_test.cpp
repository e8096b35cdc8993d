// qwen2 on the CPU against transformers: the tiny random model written by
// tools/make_tiny_qwen2.py (Q/K/V biases, NEOX RoPE, GQA, untied head) and
// transformers' float32 logits for it (tests/golden/tiny_qwen2_logits.json).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "../gguf/gguf_test_util.h"
#include "activekv/model/tensors.h"
#include "qwen2_fixture.h"

namespace activekv {
namespace {

using kv::PageFormat;

struct Comparison {
  double max_delta = 0;       // over every logit of every position
  int argmax_mismatch = 0;    // positions whose argmax differs from transformers'
  int clear_mismatch = 0;     // ... of those, where transformers' top1-top2 gap exceeds the tie margin
  int first_mismatch = -1;
};

/// Compares all-position logits with the golden. A position whose golden
/// top1-top2 gap is <= `tie_margin` may flip its argmax under an error of
/// that size: such flips are counted apart (argmax_mismatch only).
Comparison compare_to_golden(const std::vector<float>& logits, const char* what, double tie_margin = 0) {
  const auto& g = testing::qwen2_golden();
  const auto want = g["logits"].get<std::vector<std::vector<double>>>();
  const auto want_argmax = g["argmax"].get<std::vector<int32_t>>();
  const auto gap = g["top1_top2_gap"].get<std::vector<double>>();
  const size_t vocab = want.front().size();
  EXPECT_EQ(logits.size(), want.size() * vocab);
  Comparison c;
  for (size_t p = 0; p < want.size(); ++p) {
    const std::span<const float> row(logits.data() + p * vocab, vocab);
    for (size_t v = 0; v < vocab; ++v) c.max_delta = std::max(c.max_delta, std::abs(double(row[v]) - want[p][v]));
    if (model::argmax(row) != want_argmax[p]) {
      ++c.argmax_mismatch;
      if (gap[p] > tie_margin) ++c.clear_mismatch;
      if (c.first_mismatch < 0) c.first_mismatch = int(p);
      if (c.argmax_mismatch <= 3) std::printf("  position %zu: argmax %d, transformers %d (its top1-top2 gap %.4f)\n", p, model::argmax(row),
                  want_argmax[p], gap[p]);
    }
  }
  std::printf("[measured] qwen2 %s, %zu positions: max |dlogit| vs transformers = %.3e, argmax mismatches = %d\n",
              what, want.size(), c.max_delta, c.argmax_mismatch);
  return c;
}

std::vector<int32_t> golden_ids() { return testing::qwen2_golden()["token_ids"].get<std::vector<int32_t>>(); }

TEST(Qwen2, ConfigAndTensorsOfTheConvertedModel) {
  const model::ModelConfig& c = testing::qwen2_model().config();
  EXPECT_EQ(c.arch, "qwen2");
  EXPECT_EQ(c.rope_layout, model::RopeLayout::HalfSplit);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.tied_output);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.d_model, 128);
  EXPECT_EQ(c.n_heads, 2);
  EXPECT_EQ(c.n_kv_heads, 1);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.rope_dim, 64);  // no rope.dimension_count in a converted qwen2: the head dim
  EXPECT_EQ(c.ffn_dim, 96);
  EXPECT_EQ(c.vocab_size, 96);
  EXPECT_EQ(c.rope_base, 1e6f);
  EXPECT_EQ(c.rms_eps, 1e-6f);
  const model::ModelTensors t = model::ModelTensors::find(testing::qwen2_file(), c);
  for (size_t l = 0; l < t.layers.size(); ++l) {
    SCOPED_TRACE(l);
    ASSERT_NE(t.layers[l].bq, nullptr);
    ASSERT_NE(t.layers[l].bk, nullptr);
    ASSERT_NE(t.layers[l].bv, nullptr);
    EXPECT_EQ(t.layers[l].bq->dims, std::vector<uint64_t>{128});
    EXPECT_EQ(t.layers[l].bk->dims, std::vector<uint64_t>{64});
    EXPECT_EQ(t.layers[l].bv->dims, std::vector<uint64_t>{64});
  }
}

// fp32 history: only fp32 summation order differs from transformers.
// Measured 1.0e-5 max over 40 x 96 logits (|logit| up to 17.9), every argmax
// equal (the smallest top1-top2 gap in the window is 0.0065). What the bound
// catches, measured by breaking src/model on purpose: Q/K/V biases added
// after RoPE 6.5, the V bias dropped 5.6, interleaved instead of NEOX RoPE
// pairs 8.8, RoPE base 1e4 instead of the file's 1e6 8.5, RMS epsilon 1e-5
// instead of the file's 1e-6 1.1e-4.
TEST(Qwen2, F32HistoryMatchesTransformersFloat32) {
  const Comparison c = compare_to_golden(
      testing::all_position_logits(testing::qwen2_model(), golden_ids(), 16, PageFormat::f32), "f32 pages");
  EXPECT_EQ(c.argmax_mismatch, 0) << "first at position " << c.first_mismatch;
  EXPECT_LE(c.max_delta, 3e-5);
}

// bf16 history (the exact tier): K/V rounded to bf16. Measured 0.043 max;
// one argmax flip, at position 10, where transformers' top1-top2 gap is
// 0.0065 (the window's smallest; the next are 0.035 and 0.094).
TEST(Qwen2, Bf16HistoryStaysCloseToTransformers) {
  const double bound = 0.13;
  const Comparison c = compare_to_golden(
      testing::all_position_logits(testing::qwen2_model(), golden_ids(), 16, PageFormat::bf16), "bf16 pages",
      2 * bound);
  EXPECT_EQ(c.clear_mismatch, 0) << "an argmax flipped where transformers' gap exceeds " << 2 * bound;
  EXPECT_LE(c.argmax_mismatch, 1);
  EXPECT_LE(c.max_delta, bound);
}

// One pass over all positions equals a prefill in chunks across page
// boundaries (the bias is added per row, RoPE per position): measured
// 6.7e-6, the fp32 summation order of the differently sized GEMMs.
TEST(Qwen2, ChunkedForwardEqualsOnePass) {
  model::LlamaModel& m = testing::qwen2_model();
  const std::vector<int32_t> ids = golden_ids();
  const size_t vocab = size_t(m.config().vocab_size);
  const std::vector<float> whole = testing::all_position_logits(m, ids, 16, PageFormat::f32);
  kv::PageStore store(m.kv_shape(16, PageFormat::f32));
  kv::SequenceKv seq(store);
  std::vector<float> last(vocab);
  double delta = 0;
  for (size_t i = 0; i < ids.size(); i += 7) {
    const size_t n = std::min<size_t>(7, ids.size() - i);
    m.forward(std::span<const int32_t>(ids).subspan(i, n), seq, last);
    for (size_t v = 0; v < vocab; ++v)
      delta = std::max(delta, double(std::abs(last[v] - whole[(i + n - 1) * vocab + v])));
  }
  std::printf("[measured] qwen2 chunks of 7 vs one pass: max |dlogit| %.2e\n", delta);
  EXPECT_LE(delta, 2e-5);
}

// ForwardOptions::on_stage (what the GPU tests compare the GPU forward with,
// stage by stage): the embedding, then per layer queries, attention output
// and layer output, in that order, with their widths; observing changes no
// logit; the last layer's output is the residual the head reads (its last
// row differs from the embedding, so it is not a stale buffer).
TEST(Qwen2, StageObserverSeesEveryStageInOrder) {
  model::LlamaModel& m = testing::qwen2_model();
  const model::ModelConfig& c = m.config();
  const std::vector<int32_t> ids = golden_ids();
  const std::vector<float> plain = testing::all_position_logits(m, ids, 16, PageFormat::f32);
  struct Seen { int layer; model::Stage stage; int T, width; float last; };
  std::vector<Seen> seen;
  model::ForwardOptions fo = m.options();
  const model::ForwardOptions saved = fo;
  fo.on_stage = [&](int layer, model::Stage stage, int T, int width, const float* rows) {
    seen.push_back({layer, stage, T, width, rows[size_t(T) * size_t(width) - 1]});
  };
  m.set_options(fo);
  const std::vector<float> observed = testing::all_position_logits(m, ids, 16, PageFormat::f32);
  m.set_options(saved);
  EXPECT_EQ(plain, observed);
  ASSERT_EQ(seen.size(), size_t(1 + 3 * c.n_layers));
  const int qd = c.n_heads * c.head_dim, T = int(ids.size());
  EXPECT_EQ(seen[0].layer, -1);
  EXPECT_EQ(seen[0].stage, model::Stage::embedding);
  EXPECT_EQ(seen[0].width, c.d_model);
  for (int l = 0; l < c.n_layers; ++l) {
    const model::Stage want[3] = {model::Stage::queries, model::Stage::attention, model::Stage::layer_output};
    for (int k = 0; k < 3; ++k) {
      const Seen& s = seen[size_t(1 + 3 * l + k)];
      EXPECT_EQ(s.layer, l);
      EXPECT_EQ(s.stage, want[k]) << "layer " << l << " stage " << k << ": " << model::stage_name(s.stage);
      EXPECT_EQ(s.T, T);
      EXPECT_EQ(s.width, k == 2 ? c.d_model : qd);
    }
  }
  EXPECT_NE(seen.back().last, seen[0].last);
}

class Qwen2Greedy : public ::testing::TestWithParam<PageFormat> {};

// 16 greedy tokens after a 24-token prompt equal transformers' (the prompt
// was chosen with every top1-top2 gap >= 0.39 on the way).
TEST_P(Qwen2Greedy, MatchesTransformers) {
  const auto& g = testing::qwen2_golden()["greedy"];
  const auto want = g["continuation_ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(want.size(), 16u);
  const std::vector<int32_t> got =
      testing::greedy_tokens(testing::qwen2_model(), g["prompt_ids"].get<std::vector<int32_t>>(), 16, 16, GetParam());
  EXPECT_EQ(got, want);
}

INSTANTIATE_TEST_SUITE_P(Formats, Qwen2Greedy, ::testing::Values(PageFormat::bf16, PageFormat::f32),
                         [](const auto& info) { return kv::format_name(info.param); });

// The golden comparison sees the biases: the same file with every Q/K/V bias
// zeroed is far from transformers (measured 8.2 max |dlogit|, 20 of 40
// argmaxes differ), so a forward pass that ignored them could not pass above.
TEST(Qwen2, ZeroedBiasesAreFarFromTransformers) {
  std::vector<uint8_t> bytes = gguf::testing::read_bytes(testing::qwen2_path());
  int zeroed = 0;
  for (const gguf::TensorInfo& t : testing::qwen2_file().tensors()) {
    if (t.name.ends_with(".bias")) {
      std::memset(bytes.data() + t.offset, 0, t.n_bytes);
      ++zeroed;
    }
  }
  ASSERT_EQ(zeroed, 6);
  const gguf::File f = gguf::File::from_memory(bytes);
  model::LlamaModel m(f);
  const Comparison c =
      compare_to_golden(testing::all_position_logits(m, golden_ids(), 16, PageFormat::f32), "biases zeroed");
  EXPECT_GE(c.max_delta, 1.0);
  EXPECT_GE(c.argmax_mismatch, 5);
}

}  // namespace
}  // namespace activekv
