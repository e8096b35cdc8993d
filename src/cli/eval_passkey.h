// `activekv eval --passkey`: the passkey retrieval check (eval/passkey.h),
// its table and JSON.
#pragma once

#include <string>

#include "activekv/eval/passkey.h"

namespace activekv::cli {

/// Runs the check on a loaded model, prints a table (per depth and route) and
/// writes `json_out`: {"model", "context", "seed", "prompt_tokens", ...,
/// "records": [per depth and route], "summary": [per route]}. Returns 0.
int run_passkey_eval(model::LlamaModel& m, const Tokenizer& tok, const eval::PasskeyConfig& cfg,
                     const std::string& model_name, const std::string& json_out);

}  // namespace activekv::cli
