// Shared by the CPU and GPU Gemma 3 tests: Gemma 3 270M
// (models/gemma-3-270m-q4_k_m.gguf, `scripts/setup.sh --gemma3`), loaded once
// per test binary; tests skip, saying so, when it is absent.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include "activekv/gguf/gguf.h"
#include "activekv/model/llama_model.h"

namespace activekv::testing {

inline std::string gemma3_path() { return std::string(ACTIVEKV_MODEL_DIR) + "/gemma-3-270m-q4_k_m.gguf"; }

/// The opened file, or nullptr when the model is absent (the caller skips).
inline const gguf::File* gemma3_file() {
  static std::unique_ptr<gguf::File> f;
  if (!f && std::filesystem::exists(gemma3_path())) f = std::make_unique<gguf::File>(gguf::File::open(gemma3_path()));
  return f.get();
}

/// The CPU model (fp32 weights), or nullptr when the model is absent.
inline model::LlamaModel* gemma3() {
  static std::unique_ptr<model::LlamaModel> m;
  if (!m && gemma3_file()) m = std::make_unique<model::LlamaModel>(*gemma3_file());
  return m.get();
}

}  // namespace activekv::testing

/// Declares `m` (the CPU model) or skips the test when the model is absent.
#define GEMMA3_OR_SKIP(m)                                                                              \
  model::LlamaModel* m = ::activekv::testing::gemma3();                                                \
  if (m == nullptr) GTEST_SKIP() << "Gemma 3 model absent: " << ::activekv::testing::gemma3_path()     \
                                 << " (run scripts/setup.sh --gemma3)"
