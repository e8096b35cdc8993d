// `activekv calibrate`: H2D bandwidth vs copy size and attention-kernel time vs
// context, written as the transfer model's profile JSON (SPEC §6). Code: bench/gpu.
#include "commands.h"
#include "options.h"
#include "gpu_bench.h"
#include "provenance.h"

namespace activekv::cli {

void add_calibrate(CLI::App& app, std::function<int()>& run) {
  auto o = std::make_shared<gpu_bench::CalibrateOptions>();
  app.add_option("--out,-o", o->out_path, "Profile JSON to write")->capture_default_str()->check(non_empty());
  app.add_option("--reps", o->reps, "Repetitions per point (median)")->capture_default_str();
  auto kernel_name = std::make_shared<std::string>(cuda::int8s_kernel_name(o->int8s.kernel));
  app.add_option("--int8s-kernel", *kernel_name, "int8s kernel to time: tc, legacy or auto (tc where the shape allows)")
      ->capture_default_str()->check(CLI::IsMember({"tc", "legacy", "auto"}));
  run = [o, kernel_name] {
    o->int8s.kernel = cuda::parse_int8s_kernel(*kernel_name);
    o->provenance = {git_commit(), command_line(), activekv_environment()};
    gpu_bench::calibrate(*o);
    return 0;
  };
}

}  // namespace activekv::cli
