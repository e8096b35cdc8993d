// Shared test fixture: the default model, loaded once per test binary.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "activekv/gguf/gguf.h"
#include "activekv/model/llama_model.h"

namespace activekv::testing {

inline std::string model_path() {
  return std::string(ACTIVEKV_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

/// The opened default model; fails the test (not skip) if setup has not installed it.
inline const gguf::File& model_file() {
  static std::unique_ptr<gguf::File> f;
  if (!f) {
    if (!std::filesystem::exists(model_path())) {
      ADD_FAILURE() << "model missing: " << model_path() << " -- run scripts/setup.sh";
      throw std::runtime_error("model missing");
    }
    f = std::make_unique<gguf::File>(gguf::File::open(model_path()));
  }
  return *f;
}

inline model::LlamaModel& shared_model() {
  static std::unique_ptr<model::LlamaModel> m;
  if (!m) m = std::make_unique<model::LlamaModel>(model_file());
  return *m;
}

inline nlohmann::json load_golden(const std::string& name) {
  std::ifstream in(std::string(ACTIVEKV_SOURCE_DIR) + "/tests/golden/" + name);
  if (!in) throw std::runtime_error("golden file missing: " + name);
  return nlohmann::json::parse(in);
}

}  // namespace activekv::testing
