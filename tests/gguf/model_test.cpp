// Opens the real model installed by setup and checks a few facts and the
// dequantisation of token_embd.weight (Q8_0) and blk.0.attn_q.weight (Q4_1)
// against values printed by gguf-py (gguf.quants.dequantize) for their first two rows.
#include <gtest/gtest.h>

#include <bit>
#include <filesystem>

#include "gguf_test_util.h"

namespace activekv::gguf {
namespace {

const std::string kModel = std::string(ACTIVEKV_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";

struct Sample {
  size_t index;
  uint32_t bits;
};

/// Dequantises the first two rows and compares sampled elements bitwise and
/// the sequential double sum of all of them (same order as the Python loop).
void check_first_rows(const File& f, const char* name, TensorType type,
                      std::initializer_list<Sample> samples, double want_sum) {
  SCOPED_TRACE(name);
  const TensorInfo& t = f.tensor(name);
  ASSERT_EQ(t.type, type);
  ASSERT_EQ(t.dims.at(0), 576u);
  std::vector<float> rows(2 * 576);
  dequantize(t.type, t.data, rows.data(), rows.size());
  for (const Sample& s : samples) {
    EXPECT_EQ(std::bit_cast<uint32_t>(rows[s.index]), s.bits) << "element " << s.index;
  }
  double sum = 0;
  for (float v : rows) sum += v;
  EXPECT_EQ(sum, want_sum);
}

TEST(Model, SmolLM2Q4_1) {
  ASSERT_TRUE(std::filesystem::exists(kModel))
      << "model file " << kModel << " is missing: run setup (it installs the model)";
  const File f = File::open(kModel);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.tensors().size(), 272u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_u64("llama.block_count"), 30u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.get_array("tokenizer.ggml.tokens").size(), 49152u);

  const TensorInfo& emb = f.tensor("token_embd.weight");
  EXPECT_EQ(emb.dims, (std::vector<uint64_t>{576, 49152}));
  EXPECT_EQ(emb.offset, 1785664u);  // absolute, as gguf-py reports it
  check_first_rows(f, "token_embd.weight", TensorType::Q8_0,
                   {{0, 0xbdda3400}, {1, 0x3d071400}, {2, 0x3d456c00}, {3, 0xbcbb0800},
                    {100, 0x3d59c000}, {575, 0x3cf3c000}, {576, 0xbcc30000},
                    {1000, 0x3bf2e000}, {1151, 0xbe038500}},
                   -1.8948822021484375);
  check_first_rows(f, "blk.0.attn_q.weight", TensorType::Q4_1,
                   {{0, 0xbdc54000}, {1, 0x3e212000}, {2, 0xbdc54000}, {3, 0xbf3b0000},
                    {100, 0x3e5b4000}, {575, 0x3dfd0000}, {576, 0xbdf04000},
                    {1000, 0xbe0dc000}, {1151, 0x3ef51800}},
                   0.295166015625);
}

}  // namespace
}  // namespace activekv::gguf
