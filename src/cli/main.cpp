// activekv: long-context decoding with the KV history in paged host memory.
// With no subcommand, runs `generate` with its defaults (the main job).
#include <fmt/format.h>

#include <cstdlib>
#include <exception>

#include "activekv/core/error.h"
#include "commands.h"

namespace activekv::cli {

std::string default_model_path() {
  if (const char* env = std::getenv("ACTIVEKV_MODEL"); env && *env) return env;
  return ACTIVEKV_DEFAULT_MODEL;
}

std::string default_prompt_path() { return ACTIVEKV_DEFAULT_PROMPT; }

}  // namespace activekv::cli

int main(int argc, char** argv) {
  CLI::App app{"ActiveKV: LLM decoding with the KV history in paged host memory.\n"
               "Run with no arguments to generate from the default model and prompt."};
  app.require_subcommand(0, 1);
  std::function<int()> run_generate, run_inspect;
  auto* gen = app.add_subcommand("generate", "Generate text (the default command)");
  activekv::cli::add_generate(*gen, run_generate);
  auto* ins = app.add_subcommand("inspect", "Print a GGUF model's architecture and tensors");
  activekv::cli::add_inspect(*ins, run_inspect);
  CLI11_PARSE(app, argc, argv);
  try {
    if (*ins) return run_inspect();
    return run_generate();  // `generate` or no subcommand
  } catch (const activekv::Error& e) {
    fmt::print(stderr, "activekv: error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "activekv: internal error: {}\n", e.what());
    return 2;
  }
}
