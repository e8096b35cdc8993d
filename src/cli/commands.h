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
/// `activekv bench -m MODEL ...`: the whole model's speed in llama-bench's
/// form (bench_model.h); in every build (--device cpu without CUDA).
void add_bench(CLI::App& app, std::function<int()>& run);
/// `activekv serve`: the OpenAI-compatible server (src/serve); in every build
/// (without cpp-httplib it says so).
void add_serve(CLI::App& app, std::function<int()>& run);
#ifdef ACTIVEKV_HAVE_CUDA
/// `bench decode` and `calibrate`: the GPU decode engine alone (bench/gpu).
void add_bench_decode(CLI::App& app, std::function<int()>& run);
void add_calibrate(CLI::App& app, std::function<int()>& run);
#else
/// A CPU-only build keeps the GPU subcommands' names, so that asking for one
/// says what is missing instead of "argument not expected".
void add_missing_cuda(CLI::App& app, std::function<int()>& run);
#endif

}  // namespace activekv::cli
