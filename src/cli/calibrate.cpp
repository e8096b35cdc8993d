// `activekv calibrate`: H2D bandwidth vs copy size and attention-kernel time vs
// context, written as the transfer model's profile JSON (SPEC §6). Code: bench/gpu.
#include "commands.h"
#include "gpu_bench.h"
#include "provenance.h"

namespace activekv::cli {

void add_calibrate(CLI::App& app, std::function<int()>& run) {
  auto o = std::make_shared<gpu_bench::CalibrateOptions>();
  app.add_option("--out,-o", o->out_path, "Profile JSON to write")->capture_default_str();
  app.add_option("--reps", o->reps, "Repetitions per point (median)")->capture_default_str();
  run = [o] {
    o->provenance = {git_commit(), command_line()};
    gpu_bench::calibrate(*o);
    return 0;
  };
}

}  // namespace activekv::cli
