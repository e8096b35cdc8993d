// The GPU benchmark and calibration of the decode engine: the `activekv
// calibrate` and `activekv bench decode` subcommands (src/cli). Library
// activekv_gpu_bench (bench/gpu, built with the CUDA backend); code in
// calibrate.cpp and decode_bench.cpp. Not engine API: the engine
// (activekv_cuda) does not depend on it.
//
// Transfer model (SPEC §6): a copy of `b` bytes costs b / B(b), where B(b) is
// the calibrated host->device bandwidth of back-to-back pinned copies of that
// size (so the per-copy latency is inside it; `latency_ms` is the time of one
// isolated 4 KiB copy, reported alone). Attention over N tokens costs
// kernel_ms(N) (piecewise linear in N), the merge merge_ms(S) for S splits per
// sequence. A step is simulated job by job: the copy stream runs copies back to
// back, a copy into a ring slot waits for the attention that last used the
// slot, attention on a job waits for its copy and for the previous attention.
// The predicted step is when the last merge ends.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "activekv/cuda/decode_attention.h"
#include "activekv/cuda/format_kernels.h"

namespace activekv::gpu_bench {

using cuda::AttnShape;
using cuda::Int8sKernelOptions;
using cuda::Int8sTcConfig;

/// Calibrated profile of one GPU + host (units: bytes, milliseconds, GB/s = 1e9 B/s).
struct Profile {
  std::string device;
  AttnShape attn;                   ///< shape the kernel curve was measured with
  double latency_ms = 0;            ///< one isolated 4 KiB pinned H2D copy
  std::vector<double> copy_bytes;   ///< ascending sizes
  std::vector<double> copy_gbps;    ///< back-to-back H2D bandwidth at that size
  std::vector<double> kernel_tokens;  ///< ascending token counts (batch 1)
  std::vector<double> kernel_ms;      ///< split-attention kernel time at that count
  std::vector<double> merge_splits;   ///< ascending splits per sequence
  std::vector<double> merge_ms;
  std::vector<double> int8s_kernel_ms;  ///< int8s kernel time at kernel_tokens
  double unpack_ms_per_page = 0;        ///< lossless13 -> bf16 unpack, per page

  double bandwidth_gbps(double bytes) const;  ///< B(bytes), log-size interpolation, clamped
  double copy_time_ms(double bytes) const { return bytes / (bandwidth_gbps(bytes) * 1e6); }
  double kernel_time_ms(double tokens) const;  ///< bf16 kernel; linear interpolation / extrapolation
  double int8s_kernel_time_ms(double tokens) const;  ///< int8s kernel, same
  double merge_time_ms(double splits) const;
  /// The profile as JSON (byte and token counts as exact integers).
  nlohmann::json to_json() const;
};

/// Where a result came from, recorded in every JSON file written here.
struct Provenance {
  std::string commit;   ///< full git commit of the source tree
  std::string command;  ///< the command line
  std::map<std::string, std::string> environment;  ///< the ACTIVEKV_* switches set (cli::activekv_environment)
};

struct CalibrateOptions {
  AttnShape attn{4, 6, 256, 1024, 512, 0.f};
  int reps = 20;
  Int8sKernelOptions int8s;  ///< the int8s kernel whose time is calibrated
  std::string out_path = "profile.json";  ///< "" = don't write
  int device = 0;
  Provenance provenance;  ///< recorded in the profile file
};

/// Measures the profile on GPU `opt.device` (a few seconds), prints a table
/// and writes the profile to opt.out_path. Throws CudaError without a usable
/// GPU, InvalidArgument for a bad shape, Error when the file cannot be written.
Profile calibrate(const CalibrateOptions& opt);

struct BenchDecodeOptions {
  int n_layers = 16;
  AttnShape attn{4, 6, 256, 1024, 512, 0.f};
  std::vector<int64_t> contexts{32768, 65536, 131072};
  std::vector<int> batches{1, 4};
  std::vector<std::string> modes{"streamed", "resident"};  ///< also "streamed-whole" (whole-layer staging)
  /// Routes over the history: bf16 (exact), lossless13, int8s, hybrid (SPEC §2).
  std::vector<std::string> formats{"bf16"};
  int recent_pages = 2;               ///< hybrid: full pages kept exact before the tail
  Int8sKernelOptions int8s;           ///< int8s kernel switches
  /// tc kernel launch configurations to sweep (issue 13; names of
  /// cuda::int8s_tc_config_names()): each runs the int8s and hybrid formats
  /// again on engines of its own over the same history (bf16 and lossless13
  /// once, with the first); records carry the configuration. Empty: int8s.tc.
  std::vector<Int8sTcConfig> tc_configs;
  bool overlap_formats = true;  ///< EngineConfig::overlap_formats (--serial-formats: false)
  int steps = 20;
  int warmup = 3;
  int tile_pages = 32;
  int ring_slots = 3;
  int host_threads = 0;  ///< 0 = hardware concurrency
  /// Co-attention (issue 12): fractions of each (sequence, layer)'s pages the
  /// host CPU attends in place, oldest first, the tail page never (0 = none).
  /// Every mode runs at every share; the resident run at share 0 is the
  /// reference. -1: auto (route::plan_co_attention over rates measured at start).
  std::vector<double> cpu_shares{0.0};
  int cpu_threads = 0;  ///< CPU kernel threads; 0 = hardware concurrency - 1
  /// auto, as the runtime runs it: this many rounds of a few steps at the
  /// plan so far, each correcting the CPU rates from the engine's measured
  /// CPU tasks (route/cpu_rate_feedback.h) and planning again, before the
  /// timed steps; 0: the calibration's plan alone (the check of the calibration).
  int cpu_feedback_rounds = 3;
  std::string json_path = "bench_decode.json";
  std::string profile_path = "profile.json";  ///< calibrated in-process and written here ("" = don't write)
  Provenance provenance;  ///< recorded in the JSON and the profile
  int device = 0;
  /// GPUs the step is split over by KV head (issue 15), one shard per entry,
  /// the first the home device; a device listed twice holds two shards that
  /// share its link (`0,0`). Empty: {device}, unsharded. Each distinct
  /// device is calibrated (its link and kernels); the bus limit is the
  /// slowest device's bytes over its link.
  std::vector<int> gpus;
  /// Shards: a run of pages' ranges as one cudaMemcpy2DAsync (EngineConfig::strided_copies).
  bool copy_2d = false;
};

/// Runs the benchmark, prints a table, writes JSON records (streamed records
/// carry `bitwise_equal_resident`; resident records are the reference and do
/// not; records with a CPU share carry `max_rel_diff_vs_resident` instead,
/// the largest |difference| of an output row over that row's largest |value|).
/// Returns 0 on success, 1 if a streamed output was not bitwise equal to the
/// resident one, a CPU-share output differed by more than 1e-4, a run was not
/// repeatable or an output not finite.
/// Throws InvalidArgument for bad options (before touching the GPU).
int run_bench_decode(const BenchDecodeOptions& opt);

}  // namespace activekv::gpu_bench
