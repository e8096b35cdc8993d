// activekv: long-context decoding with the KV history in paged host memory.
// With no subcommand, runs `generate` with its defaults (the main job).
#include <fmt/format.h>

#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "activekv/core/blas.h"
#include "activekv/core/error.h"
#include "commands.h"
#include "memory.h"
#include "options.h"
#include "provenance.h"

namespace activekv::cli {

std::string default_model_path() {
  if (const char* env = std::getenv("ACTIVEKV_MODEL"); env && *env) return env;
  return ACTIVEKV_DEFAULT_MODEL;
}

std::string default_prompt_path() { return ACTIVEKV_DEFAULT_PROMPT; }

#ifndef ACTIVEKV_HAVE_CUDA
void add_missing_cuda(CLI::App& app, std::function<int()>& run) {
  app.description(app.get_description() + " [not in this build: needs the CUDA backend]");
  app.allow_extras();
  // "bench decode", not "decode": the parent's name when it is a subcommand too.
  const CLI::App* parent = app.get_parent();
  std::string name = app.get_name();
  if (parent && parent->get_parent()) name = parent->get_name() + " " + name;
  run = [name]() -> int {
    throw Error(name + ": this activekv was built without the CUDA backend (ACTIVEKV_CUDA=OFF, or no nvcc at "
                "configure time)");
  };
}
#endif

}  // namespace activekv::cli

int main(int argc, char** argv) {
  // libgomp's idle threads spin for 300k iterations by default; when other
  // processes want the cores, spinning threads starve the ones with work
  // (seen: 46 ms/token became 1.6 s/token). Sleeping at once (PASSIVE) costs
  // 3x on a quiet machine (187 vs 62 ms/token at 4K context), a short spin
  // costs nothing there. libgomp reads the setting before main runs, so set
  // it and re-execute once; explicit OMP_WAIT_POLICY/GOMP_SPINCOUNT win.
  bool reexec = !std::getenv("OMP_WAIT_POLICY") && !std::getenv("GOMP_SPINCOUNT") &&
                setenv("GOMP_SPINCOUNT", "10000", 1) == 0;
  // OpenBLAS picks its kernels when it loads: where its CPU detection fell
  // back to a pre-AVX family on an AVX-512/AVX2 CPU (blas.h), name the right
  // one. An explicit OPENBLAS_CORETYPE wins.
  if (!std::getenv("OPENBLAS_CORETYPE")) {
    const std::string core = activekv::blas_coretype_fix();
    if (!core.empty() && setenv("OPENBLAS_CORETYPE", core.c_str(), 1) == 0) reexec = true;
  }
  if (reexec) execv("/proc/self/exe", argv);  // returns only on failure: carry on as we are
  // `activekv -n 64 ...` means `activekv generate -n 64 ...`: generate is the default.
  std::vector<char*> args(argv, argv + argc);
  const std::string first = argc > 1 ? argv[1] : "";
  static char generate_word[] = "generate";
  if (!first.empty() && first[0] == '-' && first != "-h" && first != "--help" && first != "--help-all") {
    args.insert(args.begin() + 1, generate_word);
  }
  argc = int(args.size());
  argv = args.data();
  activekv::cli::set_command_line(argc, argv);
  // llama-bench spells the cache type -ctk, a single-dash long name CLI11
  // cannot declare: `bench` takes it as its long form --cache-type-k (after
  // the command line is recorded, so results show what was typed).
  static char ctk_long[] = "--cache-type-k";
  bool in_bench = false;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    in_bench = in_bench || s == "bench";
    if (in_bench && s == "-ctk") argv[i] = ctk_long;
  }
  CLI::App app{"ActiveKV: LLM decoding with the KV history in paged host memory.\n"
               "Run with no arguments to generate from the default model and prompt."};
  app.require_subcommand(0, 1);
  std::function<int()> run_generate, run_inspect;
  auto* gen = app.add_subcommand("generate", "Generate text (the default command)");
  activekv::cli::add_generate(*gen, run_generate);
  auto* ins = app.add_subcommand("inspect", "Print a GGUF model's architecture and tensors");
  activekv::cli::add_inspect(*ins, run_inspect);
  std::function<int()> run_eval;
  auto* ev = app.add_subcommand("eval", "Quality contract (SPEC 5): own-format error, perplexity, top-1, KL");
  activekv::cli::add_eval(*ev, run_eval);
  std::function<int()> run_gate;
  auto* gate = app.add_subcommand("gate", "Economic gate (SPEC 6): accept a format per context from bench + eval results");
  activekv::cli::add_gate(*gate, run_gate);
  std::function<int()> run_serve;
  auto* srv = app.add_subcommand("serve", "OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, "
                                          "/v1/models, /health, /metrics)");
  activekv::cli::add_serve(*srv, run_serve);
  std::function<int()> run_bench, run_bench_decode, run_calibrate;
#ifdef ACTIVEKV_HAVE_CUDA
  constexpr const char* kBenchDecode = "`bench decode`: the GPU decode engine alone";
#else
  constexpr const char* kBenchDecode = "`bench decode`: the GPU decode engine alone [not in this build]";
#endif
  auto* bench = app.add_subcommand("bench", std::string("A model's prompt and decode speed in llama-bench's form "
                                                        "(bench -m MODEL -p 512 -n 128 -d 0,32k -ctk bf16,hybrid "
                                                        "--kv-placement host,gpu); ") + kBenchDecode);
  bench->require_subcommand(0, 1);
  activekv::cli::add_bench(*bench, run_bench);
  auto* bench_dec = bench->add_subcommand("decode", "Decode-step latency vs depth per kv-format: streamed from pinned "
                                                    "host memory, resident, transfer-model prediction, bus-limit ratio");
  auto* cal = app.add_subcommand("calibrate", "Measure H2D bandwidth and kernel time: the transfer model's profile");
#ifdef ACTIVEKV_HAVE_CUDA
  activekv::cli::add_bench_decode(*bench_dec, run_bench_decode);
  activekv::cli::add_calibrate(*cal, run_calibrate);
#else
  activekv::cli::add_missing_cuda(*bench_dec, run_bench_decode);
  activekv::cli::add_missing_cuda(*cal, run_calibrate);
#endif
  // Argument errors in the form of every other error: one line, named by the
  // flag -- by both its names where it has a short one (CLI11 says
  // "--n-depth" where the user typed -d, as the README does).
  // The hint names the command whose --help lists the options (the top
  // level's lists only the commands; `activekv -n 5` is generate's).
  app.failure_message([](const CLI::App* a, const CLI::Error& e) {
    std::string command = "activekv";
    for (const CLI::App* cur = a; !cur->get_subcommands().empty();) {
      cur = cur->get_subcommands().front();
      command += " " + cur->get_name();
    }
    return fmt::format("activekv: error: {} (`{} --help` lists the options)\n", activekv::cli::name_both(*a, e.what()),
                       command);
  });
  CLI11_PARSE(app, argc, argv);
  try {
    if (*ins) return run_inspect();
    if (*ev) return run_eval();
    if (*gate) return run_gate();
    if (*srv) return run_serve();
    if (*bench) return *bench_dec ? run_bench_decode() : run_bench();
    if (*cal) return run_calibrate();
    return run_generate();  // `generate` or no subcommand
  } catch (const activekv::Error& e) {
    fmt::print(stderr, "activekv: error: {}\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    // The allocations we can size in advance are checked before they are made
    // (memory.h); this is any other one.
    fmt::print(stderr, "activekv: error: out of memory: an allocation failed with {} available "
               "(MemAvailable in /proc/meminfo; a process limit such as ulimit -v can be lower)\n",
               activekv::cli::describe_bytes(activekv::cli::available_memory_bytes()));
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "activekv: internal error: {}\n", e.what());
    return 2;
  }
}
