// ModelConfig::from_gguf on small in-memory llama files: a valid one reads
// (and its weights load), and each hyper-parameter the engine cannot run is
// rejected with one line naming the key and the value. Before these checks a
// NaN epsilon or a zero RoPE base ran and printed garbage with exit 0.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "../gguf/gguf_test_util.h"
#include "activekv/model/config.h"
#include "activekv/model/weights.h"

namespace activekv::model {
namespace {

using gguf::testing::Parts;
using gguf::testing::val_f32;
using gguf::testing::val_f64;
using gguf::testing::val_i32;
using gguf::testing::val_str;
using gguf::testing::val_str_array;
using gguf::testing::val_u32;

/// A complete tiny model of architecture `arch` ("llama", "qwen2" whose
/// layers also carry attn_{q,k,v}.bias, or "gemma3" with its QK-norms,
/// post-norms and sliding window 3): d_model 8, 2 heads of dim 4 (1 KV head),
/// FFN 16, vocab 16, 2 blocks (gemma3: 6, so that one is global), F32 tensors.
Parts tiny_model(const std::string& arch) {
  const std::string k = arch + ".";
  const int blocks = arch == "gemma3" ? 6 : 2;
  Parts p;
  p.set("general.architecture", val_str(arch))
      .set(k + "block_count", val_u32(uint32_t(blocks)))
      .set(k + "context_length", val_u32(64))
      .set(k + "embedding_length", val_u32(8))
      .set(k + "feed_forward_length", val_u32(16))
      .set(k + "attention.head_count", val_u32(2))
      .set(k + "attention.head_count_kv", val_u32(1))
      .set(k + "rope.dimension_count", val_u32(4))
      .set(k + "rope.freq_base", val_f32(10000.0f))
      .set(k + "attention.layer_norm_rms_epsilon", val_f32(1e-5f))
      .set(k + "vocab_size", val_u32(16))
      .set("tokenizer.ggml.tokens", val_str_array(16));
  if (arch == "gemma3") p.set(k + "attention.sliding_window", val_u32(3));
  p.tensors = {{"token_embd.weight", {8, 16}}, {"output_norm.weight", {8}}};
  for (int l = 0; l < blocks; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    p.tensors.push_back({b + "attn_norm.weight", {8}});
    p.tensors.push_back({b + "attn_q.weight", {8, 8}});
    p.tensors.push_back({b + "attn_k.weight", {8, 4}});
    p.tensors.push_back({b + "attn_v.weight", {8, 4}});
    if (arch == "qwen2") {
      p.tensors.push_back({b + "attn_q.bias", {8}});
      p.tensors.push_back({b + "attn_k.bias", {4}});
      p.tensors.push_back({b + "attn_v.bias", {4}});
    }
    p.tensors.push_back({b + "attn_output.weight", {8, 8}});
    p.tensors.push_back({b + "ffn_norm.weight", {8}});
    p.tensors.push_back({b + "ffn_gate.weight", {8, 16}});
    p.tensors.push_back({b + "ffn_up.weight", {8, 16}});
    p.tensors.push_back({b + "ffn_down.weight", {16, 8}});
    if (arch == "gemma3") {
      p.tensors.push_back({b + "attn_q_norm.weight", {4}});
      p.tensors.push_back({b + "attn_k_norm.weight", {4}});
      p.tensors.push_back({b + "post_attention_norm.weight", {8}});
      p.tensors.push_back({b + "post_ffw_norm.weight", {8}});
    }
  }
  return p;
}

Parts tiny_llama() { return tiny_model("llama"); }

/// The from_gguf error message for `p` ("" if it reads).
std::string config_error(const Parts& p) {
  const std::vector<uint8_t> bytes = p.bytes();
  const gguf::File f = gguf::File::from_memory(bytes);
  try {
    ModelConfig::from_gguf(f);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_rejected(const Parts& p, const std::string& message) {
  const std::string what = config_error(p);
  EXPECT_EQ(what, message);
  EXPECT_EQ(what.find('\n'), std::string::npos) << "one line";
}

TEST(ModelConfig, TinyLlamaReadsAndLoads) {
  const std::vector<uint8_t> bytes = tiny_llama().bytes();
  const gguf::File f = gguf::File::from_memory(bytes);
  const ModelConfig c = ModelConfig::from_gguf(f);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.d_model, 8);
  EXPECT_EQ(c.n_heads, 2);
  EXPECT_EQ(c.n_kv_heads, 1);
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_EQ(c.rope_dim, 4);
  EXPECT_EQ(c.vocab_size, 16);
  EXPECT_EQ(c.rms_eps, 1e-5f);
  EXPECT_TRUE(c.tied_output);
  EXPECT_NO_THROW(Weights::load(f, c));  // the file is a whole model, not just metadata
}

TEST(ModelConfig, Gemma3Layers) {
  const std::vector<uint8_t> bytes = tiny_model("gemma3").set("gemma3.rope.freq_base", val_f32(1e6f)).bytes();
  const gguf::File f = gguf::File::from_memory(bytes);
  const ModelConfig c = ModelConfig::from_gguf(f);
  ASSERT_EQ(c.layer_attention.size(), 6u);
  for (int l = 0; l < 6; ++l) {  // layer 5 global with freq_base; the others slide with base 10000
    EXPECT_EQ(c.layer_attention[size_t(l)].window, l == 5 ? 0 : 3) << l;
    EXPECT_EQ(c.layer_attention[size_t(l)].rope_base, l == 5 ? 1e6f : 10000.0f) << l;
  }
  EXPECT_EQ(c.layer_split(), "5 sliding (window 3) + 1 global");
  EXPECT_FLOAT_EQ(c.embed_scale, std::sqrt(8.0f));
  EXPECT_NO_THROW(Weights::load(f, c));
  // The local RoPE base, when the file has one.
  const std::vector<uint8_t> b2 = tiny_model("gemma3").set("gemma3.rope.freq_base_swa", val_f32(500.0f)).bytes();
  EXPECT_EQ(ModelConfig::from_gguf(gguf::File::from_memory(b2)).layer_attention[0].rope_base, 500.0f);
  // llama has no sliding layer.
  const std::vector<uint8_t> b3 = tiny_llama().bytes();
  const ModelConfig llama = ModelConfig::from_gguf(gguf::File::from_memory(b3));
  EXPECT_EQ(llama.layer_split(), "2 global");
}

TEST(ModelConfig, Gemma3NeedsItsSlidingWindowAndNorms) {
  expect_rejected(tiny_model("gemma3").erase("gemma3.attention.sliding_window"),
                  "model config: gemma3.attention.sliding_window is missing (required)");
  expect_rejected(tiny_model("gemma3").set("gemma3.attention.sliding_window", val_u32(0)),
                  "model config: gemma3.attention.sliding_window = 0 must be in [1, 2147483647]");
  Parts p = tiny_model("gemma3");
  std::erase_if(p.tensors, [](const auto& t) { return t.name == "blk.2.attn_k_norm.weight"; });
  const std::vector<uint8_t> bytes = p.bytes();
  const gguf::File f = gguf::File::from_memory(bytes);
  EXPECT_THROW(Weights::load(f, ModelConfig::from_gguf(f)), Error);
}

TEST(ModelConfig, RmsEpsilon) {
  const std::string key = "model config: llama.attention.layer_norm_rms_epsilon = ";
  const std::string why = " must be a finite number > 0 (as float32)";
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const auto& [v, shown] : {std::pair{nan, "nan"}, {inf, "inf"}, {-inf, "-inf"}, {0.0f, "0"},
                                 {-0.0f, "-0"}, {-1e-5f, "-9.99999975e-06"}}) {
    expect_rejected(tiny_llama().set("llama.attention.layer_norm_rms_epsilon", val_f32(v)),
                    key + shown + why);
  }
  // Positive as float64, zero as float32.
  expect_rejected(tiny_llama().set("llama.attention.layer_norm_rms_epsilon", val_f64(1e-60)),
                  key + "9.9999999999999997e-61" + why);
  expect_rejected(tiny_llama().set("llama.attention.layer_norm_rms_epsilon", val_str("1e-5")),
                  key + "\"1e-5\" is STRING, not a number");
  // gguf.md and llama.cpp require it for llama.
  expect_rejected(tiny_llama().erase("llama.attention.layer_norm_rms_epsilon"),
                  "model config: llama.attention.layer_norm_rms_epsilon is missing (required)");
  EXPECT_EQ(config_error(tiny_llama().set("llama.attention.layer_norm_rms_epsilon", val_f64(1e-6))), "");
}

TEST(ModelConfig, RopeBase) {
  const std::string key = "model config: llama.rope.freq_base = ";
  const std::string why = " must be a finite number > 1 (as float32)";
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const auto& [v, shown] : {std::pair{0.0f, "0"}, {nan, "nan"}, {inf, "inf"}, {-5.0f, "-5"},
                                 {1.0f, "1"}, {0.5f, "0.5"}}) {
    expect_rejected(tiny_llama().set("llama.rope.freq_base", val_f32(v)), key + shown + why);
  }
  expect_rejected(tiny_llama().set("llama.rope.freq_base", val_f64(1e300)), key + "1.0000000000000001e+300" + why);
  // Absent: the llama default 10000.
  const std::vector<uint8_t> bytes = tiny_llama().erase("llama.rope.freq_base").bytes();
  EXPECT_EQ(ModelConfig::from_gguf(gguf::File::from_memory(bytes)).rope_base, 10000.0f);
}

TEST(ModelConfig, Counts) {
  for (const char* name : {"block_count", "context_length", "embedding_length", "feed_forward_length",
                           "attention.head_count", "attention.head_count_kv"}) {
    SCOPED_TRACE(name);
    const std::string key = std::string("llama.") + name;
    expect_rejected(tiny_llama().set(key, val_u32(0)),
                    "model config: " + key + " = 0 must be in [1, 2147483647]");
    expect_rejected(tiny_llama().set(key, val_i32(-3)),
                    "model config: " + key + " = -3 must be in [1, 2147483647]");
    expect_rejected(tiny_llama().set(key, gguf::testing::val_u64(uint64_t{1} << 40)),
                    "model config: " + key + " = 1099511627776 must be in [1, 2147483647]");
    expect_rejected(tiny_llama().set(key, val_f32(2.0f)),
                    "model config: " + key + " = 2 is FLOAT32, not an integer");
  }
  expect_rejected(tiny_llama().erase("llama.block_count"), "model config: llama.block_count is missing (required)");
}

TEST(ModelConfig, BlockCountMatchesTensors) {
  expect_rejected(tiny_llama().set("llama.block_count", val_u32(3)),
                  "model config: llama.block_count = 3 but the file's tensors are for blocks 0..1");
  // A smaller count would silently drop a layer.
  expect_rejected(tiny_llama().set("llama.block_count", val_u32(1)),
                  "model config: llama.block_count = 1 but the file's tensors are for blocks 0..1");
  // An absurd count fails here, before anything is sized by it.
  expect_rejected(tiny_llama().set("llama.block_count", val_u32(2000000000)),
                  "model config: llama.block_count = 2000000000 but the file's tensors are for blocks 0..1");
  Parts none = tiny_llama();
  std::erase_if(none.tensors, [](const Parts::Tensor& t) { return t.name.starts_with("blk."); });
  expect_rejected(none, "model config: llama.block_count = 2 but the file has no blk.N tensors");
}

TEST(ModelConfig, Heads) {
  expect_rejected(tiny_llama().set("llama.attention.head_count_kv", val_u32(3)),
                  "model config: llama.attention.head_count = 2 is not a multiple of "
                  "llama.attention.head_count_kv = 3");
  expect_rejected(tiny_llama().set("llama.attention.head_count", val_u32(3)).set("llama.attention.head_count_kv",
                                                                                   val_u32(3)),
                  "model config: llama.embedding_length = 8 is not a multiple of llama.attention.head_count = 3 "
                  "(and llama.attention.key_length is absent)");
  expect_rejected(tiny_llama().set("llama.attention.head_count", val_u32(8)).set("llama.attention.head_count_kv",
                                                                                   val_u32(8)),
                  "model config: llama.embedding_length / llama.attention.head_count = 1 must be even (the head dim)");
  expect_rejected(tiny_llama().set("llama.attention.key_length", val_u32(5)),
                  "model config: llama.attention.key_length = 5 must be even (the head dim)");
  expect_rejected(tiny_llama().set("llama.attention.head_count", val_u32(1 << 20))
                      .set("llama.attention.head_count_kv", val_u32(1))
                      .set("llama.attention.key_length", val_u32(1 << 12)),
                  "model config: llama.attention.head_count = 1048576 times head dim 4096 exceeds 2147483647");
  expect_rejected(tiny_llama().set("llama.attention.value_length", val_u32(8)),
                  "model config: llama.attention.value_length = 8 differs from the key head dim 4 "
                  "(the KV history needs one head dim)");
  EXPECT_EQ(config_error(tiny_llama().set("llama.attention.value_length", val_u32(4))), "");
  for (uint32_t r : {3u, 6u}) {
    expect_rejected(tiny_llama().set("llama.rope.dimension_count", val_u32(r)),
                    "model config: llama.rope.dimension_count = " + std::to_string(r) +
                        " must be even and <= the head dim 4");
  }
  EXPECT_EQ(config_error(tiny_llama().set("llama.rope.dimension_count", val_u32(2))), "");
}

TEST(ModelConfig, VocabularyMatchesTokenEmbd) {
  expect_rejected(tiny_llama().set("llama.vocab_size", val_u32(17)),
                  "model config: llama.vocab_size = 17 but token_embd.weight has 16 rows");
  expect_rejected(tiny_llama().set("tokenizer.ggml.tokens", val_str_array(15)),
                  "model config: tokenizer.ggml.tokens = (15 tokens) but token_embd.weight has 16 rows");
  expect_rejected(tiny_llama().set("tokenizer.ggml.tokens", val_str("x")),
                  "model config: tokenizer.ggml.tokens = \"x\" is STRING, not an ARRAY");
  Parts wide = tiny_llama();
  wide.tensor("token_embd.weight")->dims = {10, 16};
  expect_rejected(wide, "model config: llama.embedding_length = 8 but token_embd.weight rows have 10 elements");
  Parts flat = tiny_llama();
  flat.tensor("token_embd.weight")->dims = {8, 16, 1};
  expect_rejected(flat, "model config: token_embd.weight has 3 dims, expected 2");
  // Both keys are optional.
  EXPECT_EQ(config_error(tiny_llama().erase("llama.vocab_size").erase("tokenizer.ggml.tokens")), "");
}

TEST(ModelConfig, Architecture) {
  expect_rejected(tiny_llama().set("general.architecture", val_str("qwen3")),
                  "model config: general.architecture = \"qwen3\" is not supported (supported: llama, qwen2, gemma3)");
  // Untrusted bytes are escaped in the message.
  expect_rejected(tiny_llama().set("general.architecture", val_str("a\nb")),
                  "model config: general.architecture = \"a\\nb\" is not supported (supported: llama, qwen2, gemma3)");
  // The keys are read under the architecture's own name.
  expect_rejected(tiny_llama().set("general.architecture", val_str("qwen2")),
                  "model config: qwen2.block_count is missing (required)");
}

TEST(ModelConfig, ArchitectureChoosesRopeLayoutAndBiases) {
  const std::vector<uint8_t> llama = tiny_model("llama").bytes();
  const ModelConfig l = ModelConfig::from_gguf(gguf::File::from_memory(llama));
  EXPECT_EQ(l.rope_layout, RopeLayout::Interleaved);
  EXPECT_FALSE(l.qkv_bias);
  const std::vector<uint8_t> qwen2 = tiny_model("qwen2").bytes();
  const gguf::File f = gguf::File::from_memory(qwen2);
  const ModelConfig q = ModelConfig::from_gguf(f);
  EXPECT_EQ(q.arch, "qwen2");
  EXPECT_EQ(q.rope_layout, RopeLayout::HalfSplit);
  EXPECT_TRUE(q.qkv_bias);
  const Weights w = Weights::load(f, q);
  for (const LayerWeights& L : w.layers) {
    EXPECT_EQ(L.bq.size(), 8u);
    EXPECT_EQ(L.bk.size(), 4u);
    EXPECT_EQ(L.bv.size(), 4u);
  }
}

/// The Weights::load error message for `p` ("" if it loads).
std::string load_error(const Parts& p) {
  const std::vector<uint8_t> bytes = p.bytes();
  const gguf::File f = gguf::File::from_memory(bytes);
  try {
    Weights::load(f, ModelConfig::from_gguf(f));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ModelConfig, Qwen2BiasMissingOrMisshapenIsNamed) {
  for (const char* name : {"blk.1.attn_q.bias", "blk.0.attn_k.bias", "blk.1.attn_v.bias"}) {
    Parts p = tiny_model("qwen2");
    std::erase_if(p.tensors, [&](const Parts::Tensor& t) { return t.name == name; });
    const std::string what = load_error(p);
    EXPECT_EQ(what, std::string("GGUF: tensor '") + name + "' not found");
    EXPECT_EQ(what.find('\n'), std::string::npos) << "one line";
  }
  Parts wide = tiny_model("qwen2");
  wide.tensor("blk.0.attn_k.bias")->dims = {8};  // the query width: a bias of the wrong projection
  EXPECT_EQ(load_error(wide), "model: tensor 'blk.0.attn_k.bias' has dims [8], expected [4]");
  // A llama file ignores bias tensors it does not use.
  Parts llama = tiny_model("qwen2");
  for (auto& kv : llama.kvs) {
    if (kv.key.starts_with("qwen2.")) kv.key.replace(0, 5, "llama");
  }
  llama.set("general.architecture", val_str("llama"));
  EXPECT_EQ(load_error(llama), "");
}

}  // namespace
}  // namespace activekv::model
