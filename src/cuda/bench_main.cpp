// activekv-bench: the GPU benchmarks without the CLI's dependencies (CLI11,
// fmt), so that the CUDA backend can be built and measured on a machine that
// has only the CUDA toolkit and CMake. The `activekv bench decode` and
// `activekv calibrate` subcommands run the same code (activekv/cuda/bench.h).
//
//   activekv-bench decode [--contexts 32k,64k,128k] [--batches 1,4] [--steps 20]
//       [--warmup 3] [--layers 16] [--tile-pages 32] [--ring 3] [--split 512]
//       [--modes streamed,resident,streamed-whole] [--json FILE] [--profile FILE]
//       [--commit SHA]
//   activekv-bench calibrate [--out FILE] [--reps 20]
#include <cstdio>
#include <cstring>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include "activekv/cuda/bench.h"

namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

int usage() {
  std::fprintf(stderr,
               "usage: activekv-bench decode [--contexts 32k,64k,128k] [--batches 1,4] [--steps N] [--warmup N]\n"
               "         [--layers N] [--tile-pages N] [--ring N] [--split N] [--modes streamed,resident]\n"
               "         [--json FILE] [--profile FILE] [--commit SHA]\n"
               "       activekv-bench calibrate [--out FILE] [--reps N]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace activekv::cuda;
  if (argc < 2) return usage();
  const std::string cmd = argv[1];
  std::string command_line;
  for (int i = 0; i < argc; ++i) command_line += (i ? " " : "") + std::string(argv[i]);
  try {
    auto need = [&](int& i) -> std::string {
      if (i + 1 >= argc) throw activekv::InvalidArgument(std::string(argv[i]) + " needs a value");
      return argv[++i];
    };
    if (cmd == "decode") {
      BenchDecodeOptions o;
      o.command = command_line;
      for (int i = 2; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--contexts") o.contexts = parse_sizes(need(i));
        else if (a == "--batches") {
          o.batches.clear();
          for (const auto& b : split_list(need(i))) o.batches.push_back(std::stoi(b));
        } else if (a == "--steps") o.steps = std::stoi(need(i));
        else if (a == "--warmup") o.warmup = std::stoi(need(i));
        else if (a == "--layers") o.n_layers = std::stoi(need(i));
        else if (a == "--tile-pages") o.tile_pages = std::stoi(need(i));
        else if (a == "--ring") o.ring_slots = std::stoi(need(i));
        else if (a == "--split") o.attn.split_tokens = std::stoi(need(i));
        else if (a == "--modes") o.modes = split_list(need(i));
        else if (a == "--json") o.json_path = need(i);
        else if (a == "--profile") o.profile_path = need(i);
        else if (a == "--commit") o.commit = need(i);
        else return usage();
      }
      return run_bench_decode(o);
    }
    if (cmd == "calibrate") {
      CalibrateOptions o;
      for (int i = 2; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--out") o.out_path = need(i);
        else if (a == "--reps") o.reps = std::stoi(need(i));
        else return usage();
      }
      calibrate(o);
      return 0;
    }
    return usage();
  } catch (const activekv::Error& e) {
    std::fprintf(stderr, "activekv-bench: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "activekv-bench: error: %s\n", e.what());
    return 2;
  }
}
