// Subcommands of the `activekv` CLI. Each registers its flags on a CLI11 app
// and returns the callback that runs it (exit code).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

namespace activekv::cli {

/// Path of the default model and prompt (set at build time to the repo's
/// models/ and data/ folders; ACTIVEKV_MODEL overrides the model).
std::string default_model_path();
std::string default_prompt_path();

void add_generate(CLI::App& app, std::function<int()>& run);
void add_inspect(CLI::App& app, std::function<int()>& run);
void add_eval(CLI::App& app, std::function<int()>& run);
/// `activekv gate`: the economic gate (SPEC 6) over bench + eval JSON. CPU
/// only (it reads measurements), so it is in every build.
void add_gate(CLI::App& app, std::function<int()>& run);
#ifdef ACTIVEKV_HAVE_CUDA
/// `bench decode` and `calibrate`: the GPU decode engine (src/cuda/bench.cpp).
void add_bench(CLI::App& app, std::function<int()>& run);
void add_calibrate(CLI::App& app, std::function<int()>& run);
#endif

}  // namespace activekv::cli
