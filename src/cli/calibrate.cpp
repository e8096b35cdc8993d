// `activekv calibrate`: H2D bandwidth vs copy size and attention-kernel time vs
// context, written as the transfer model's profile JSON (SPEC §6).
#include "activekv/cuda/bench.h"
#include "commands.h"

namespace activekv::cli {

void add_calibrate(CLI::App& app, std::function<int()>& run) {
  auto o = std::make_shared<cuda::CalibrateOptions>();
  app.add_option("--out,-o", o->out_path, "Profile JSON to write");
  app.add_option("--reps", o->reps, "Repetitions per point (median)");
  run = [o] {
    cuda::calibrate(*o);
    return 0;
  };
}

}  // namespace activekv::cli
