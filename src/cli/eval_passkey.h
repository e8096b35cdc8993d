// `activekv eval --passkey`: the passkey retrieval check (eval/passkey.h),
// its table and JSON.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "activekv/eval/passkey.h"

namespace activekv::cli {

/// Runs the check with `backend` (the CPU or the GPU one), prints a table
/// (per depth and route) and writes `json_out`: {"model", "context", "seed",
/// "prompt_tokens", ..., "records": [per depth and route], "summary": [per
/// route]} plus the fields `where` returns after the run (where the model
/// ran: "device", "placement", "activations"). Returns 0.
int run_passkey_eval(eval::PasskeyModel& backend, const Tokenizer& tok, const eval::PasskeyConfig& cfg,
                     const std::string& model_name, const std::string& json_out,
                     const std::function<nlohmann::json()>& where);

}  // namespace activekv::cli
