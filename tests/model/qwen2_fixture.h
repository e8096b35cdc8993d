// The tiny random qwen2 model (tests/fixtures/qwen2/tiny_qwen2.gguf) and its
// transformers golden (tests/golden/tiny_qwen2_logits.json), both written by
// tools/make_tiny_qwen2.py: 2 layers, d_model 128, 2 query heads of dim 64,
// 1 KV head, FFN 96, vocab 96, F32 tensors, Q/K/V biases, NEOX RoPE (base 1e6).
// Shared by the CPU tests (tests/model) and the GPU runtime test (tests/cuda).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "activekv/gguf/gguf.h"
#include "activekv/kv/page_store.h"
#include "activekv/model/llama_model.h"
#include "activekv/model/sampler.h"
#include "model_fixture.h"

namespace activekv::testing {

inline std::string qwen2_path() {
  return std::string(ACTIVEKV_SOURCE_DIR) + "/tests/fixtures/qwen2/tiny_qwen2.gguf";
}

/// The opened fixture (committed to the repository: no setup step).
inline const gguf::File& qwen2_file() {
  static const gguf::File f = gguf::File::open(qwen2_path());
  return f;
}

inline model::LlamaModel& qwen2_model() {
  static model::LlamaModel m(qwen2_file());
  return m;
}

inline const nlohmann::json& qwen2_golden() {
  static const nlohmann::json g = load_golden("tiny_qwen2_logits.json");
  return g;
}

/// Logits of every position of `ids`, [n][vocab], one forward pass over a
/// fresh history of `page_size`-token pages in `format`.
inline std::vector<float> all_position_logits(model::LlamaModel& m, const std::vector<int32_t>& ids,
                                              int page_size, kv::PageFormat format) {
  kv::PageStore store(m.kv_shape(page_size, format));
  kv::SequenceKv seq(store);
  std::vector<float> out(ids.size() * size_t(m.config().vocab_size));
  m.forward(ids, seq, out, /*all_logits=*/true);
  return out;
}

/// `n` greedy tokens after `prompt` (prefill, then one token per step).
inline std::vector<int32_t> greedy_tokens(model::LlamaModel& m, const std::vector<int32_t>& prompt, int n,
                                          int page_size, kv::PageFormat format) {
  kv::PageStore store(m.kv_shape(page_size, format));
  kv::SequenceKv seq(store);
  std::vector<float> logits = m.prefill(prompt, seq);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(model::argmax(logits));
    if (i + 1 < n) {
      const int32_t one[1] = {out.back()};
      m.forward(one, seq, logits);
    }
  }
  return out;
}

}  // namespace activekv::testing
