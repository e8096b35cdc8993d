// `bench decode`: decode-step latency of every kv-format, streamed and
// resident, beside its bus limit and the transfer model's prediction. See
// gpu_bench.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>

#include "activekv/cuda/co_attention_rates.h"
#include "activekv/cuda/decode_engine.h"
#include "activekv/cuda/device_pages.h"
#include "activekv/cuda/sharded_engine.h"
#include "activekv/route/cpu_rate_feedback.h"
#include "bandwidth.h"
#include "bench_pages.h"
#include "bench_util.h"
#include "gpu_bench.h"

namespace activekv::gpu_bench {

using cuda::DecodeEngine;
using cuda::EngineConfig;
using cuda::ShardedDecodeEngine;

namespace {

// The GPUs of the run, the home device first (one per shard).
std::vector<int> run_devices(const BenchDecodeOptions& opt) {
  return opt.gpus.empty() ? std::vector<int>{opt.device} : opt.gpus;
}

struct Record {
  std::string format, mode;
  int64_t context;
  int batch;
  double step_ms, step_ms_min, step_ms_max;
  double device_ms;        // compute-stream span of the step (cudaEvent), median
  uint64_t history_bytes;  // bytes the step's pages take across the bus (also for resident: what streaming would move)
  uint64_t bytes_per_step;
  double gbps, bus_limit_ms, bus_limit_ratio, predicted_ms, chunk_gbps;
  uint64_t copies_per_step, largest_copy, copy_rows_per_step;
  int jobs_per_layer;
  // Head shards: what each moved (its device's link), and the bus limit's inputs.
  struct Shard { int device, kv_head0, kv_heads; uint64_t history_bytes, bytes_per_step, copies, copy_rows, largest_copy; };
  std::vector<Shard> shards;
  // Streamed records: output bitwise equal to the resident run's. Absent for
  // resident records: they are the reference.
  std::optional<bool> bitwise_equal_resident;
  // Co-attention: the share of pages the CPU attends, the bytes it reads, and
  // the largest row-relative difference from the resident reference.
  double cpu_share = 0;
  bool auto_share = false;  // the planner chose the share (--cpu-share auto)
  double planned_ms = 0;    // its predicted step
  double cpu_rate_scale = 1;  // the CPU rates of the prediction over the calibrated ones (auto's feedback)
  int feedback_rounds = 0;    // auto: the rounds of steps that measured it
  // The co-attention model's parts of predicted_ms (a CPU share with the
  // rates measured): the link's and the CPU's time per step.
  std::optional<double> predicted_link_ms, predicted_cpu_ms;
  uint64_t cpu_bytes_per_step = 0;
  DecodeEngine::CpuTiming cpu_timing;  // host-clock timing of the CPU share, measured steps
  std::optional<double> max_rel_diff_vs_resident;
  bool repeatable;
  std::string tc_config;  // the tc kernel's launch configuration (int8s pages read), else empty
};

// One engine's step, its copies `link_share` times slower (the shards that
// share its device's link copy at once).
double predict_engine_ms(const Profile& pr, const DecodeEngine& eng, int n_layers, int64_t splits_per_seq,
                         double link_share) {
  const int R = eng.config().ring_slots;
  std::vector<double> ring_end;  // attention end of each streamed job: streamed job k uses ring slot k % R
  double copy_free = 0, comp_free = 0;
  for (int l = 0; l < n_layers; ++l) {
    const auto jobs = eng.job_info(l);
    for (size_t j = 0; j < jobs.size(); ++j) {
      double copy_end = 0;
      if (!jobs[j].resident) {
        const size_t k = ring_end.size();
        double start = copy_free;
        if (k >= size_t(R)) start = std::max(start, ring_end[k - R]);
        double t = 0;
        for (size_t c = 0; c < jobs[j].copy_bytes.size(); ++c) {  // a 2D copy: rows of its row size
          const double rows = double(jobs[j].copy_rows[c]);
          t += rows * pr.copy_time_ms(double(jobs[j].copy_bytes[c]) / rows) * link_share;
        }
        copy_end = start + t;
        copy_free = copy_end;
      }
      double start = std::max(comp_free, copy_end);
      const auto& tk = jobs[j].tokens_by_kind;
      const double kernel = pr.kernel_time_ms(double(tk[0] + tk[2])) +
                            (tk[1] > 0 ? pr.int8s_kernel_time_ms(double(tk[1])) : 0.0) +
                            pr.unpack_ms_per_page * double((tk[2] + pr.attn.page_size - 1) / pr.attn.page_size);
      double end = start + kernel;
      if (j + 1 == jobs.size()) end += pr.merge_time_ms(double(splits_per_seq));
      if (!jobs[j].resident) ring_end.push_back(end);
      comp_free = end;
    }
  }
  return comp_free;
}

// The slowest shard's predicted step, each on its device's profile
// (`profiles`: device -> profile), sharing its link with the device's other shards.
double predict_ms(const std::map<int, Profile>& profiles, const ShardedDecodeEngine& eng, int n_layers,
                  int64_t splits_per_seq) {
  std::map<int, int> per_device;
  for (int i = 0; i < eng.n_shards(); ++i) ++per_device[eng.shard(i).device];
  double worst = 0;
  for (int i = 0; i < eng.n_shards(); ++i) {
    const int d = eng.shard(i).device;
    worst = std::max(worst, predict_engine_ms(profiles.at(d), eng.engine(i), n_layers, splits_per_seq,
                                              double(per_device[d])));
  }
  return worst;
}

std::string mode_label(const std::string& mode, double cpu_share, bool auto_share = false) {
  if (auto_share) return mode + "+cpu-auto";
  if (cpu_share <= 0) return mode;
  char buf[32];
  std::snprintf(buf, sizeof buf, "+cpu%.0f%%", 100 * cpu_share);
  return mode + buf;
}

void print_table(const std::vector<Record>& records) {
  // llama-bench vocabulary: depth = context tokens, t/s = tokens generated per second.
  std::printf("\n| %-14s | %-15s | %7s | %5s | %9s | %17s | %8s | %9s | %6s | %9s | %6s |\n", "kv-format", "mode",
              "depth", "batch", "step ms", "min - max", "t/s", "bus ms", "ratio", "pred ms", "err %");
  std::printf("|%s|\n", std::string(134, '-').c_str());
  for (const auto& r : records)
    std::printf("| %-14s | %-15s | %7lld | %5d | %9.3f | %8.3f - %6.3f | %8.2f | %9.3f | %6.3f | %9.3f | %6.2f |\n",
                (r.tc_config.empty() ? r.format : r.format + "/" + r.tc_config).c_str(),
                mode_label(r.mode, r.cpu_share, r.auto_share).c_str(), static_cast<long long>(r.context), r.batch, r.step_ms,
                r.step_ms_min, r.step_ms_max, r.batch * 1000.0 / r.step_ms, r.bus_limit_ms, r.bus_limit_ratio,
                r.predicted_ms, 100.0 * (r.predicted_ms - r.step_ms) / r.step_ms);
  for (const auto& r : records) {
    const DecodeEngine::CpuTiming& c = r.cpu_timing;
    if (c.steps == 0 || c.busy_ms <= 0) continue;
    std::printf("  CPU share, %s %s depth %lld: busy %.2f ms/step at %.1f GB/s, idle between layers %.2f ms/step "
                "(%.1f layer tasks/step)\n",
                r.format.c_str(), mode_label(r.mode, r.cpu_share, r.auto_share).c_str(),
                static_cast<long long>(r.context), c.busy_ms / double(c.steps),
                double(c.bytes) / (c.busy_ms * 1e6), c.idle_ms / double(c.steps), double(c.layers) / double(c.steps));
  }
}

const Record* find_record(const std::vector<Record>& rs, const std::string& f, const std::string& m, int64_t ctx,
                          int batch, const std::string& tc_config) {
  for (const Record& r : rs)
    if (r.format == f && r.mode == m && r.context == ctx && r.batch == batch && r.tc_config == tc_config) return &r;
  return nullptr;
}

nlohmann::json conversion_json(const HistorySet::Conversion& c) {
  return {{"pages", c.pages}, {"seconds", c.seconds}, {"threads", c.threads},
          {"pages_per_s", c.seconds > 0 ? double(c.pages) / c.seconds : 0.0}};
}

nlohmann::json record_json(const Record& r, int steps) {
  nlohmann::json j = {
      {"format", r.format}, {"mode", r.mode}, {"context", r.context}, {"depth", r.context}, {"batch", r.batch},
      {"step_ms", r.step_ms}, {"step_ms_min", r.step_ms_min}, {"step_ms_max", r.step_ms_max},
      {"device_ms", r.device_ms}, {"steps", steps}, {"t_per_s", r.batch * 1000.0 / r.step_ms},
      {"history_bytes", r.history_bytes}, {"bytes_per_step", r.bytes_per_step}, {"gbps", r.gbps},
      {"copies_per_step", r.copies_per_step}, {"largest_copy", r.largest_copy},
      {"copy_rows_per_step", r.copy_rows_per_step},
      {"bytes_per_copy", r.copies_per_step ? double(r.bytes_per_step) / double(r.copies_per_step) : 0.0},
      {"bytes_per_copy_row", r.copy_rows_per_step ? double(r.bytes_per_step) / double(r.copy_rows_per_step) : 0.0},
      {"jobs_per_layer", r.jobs_per_layer}, {"chunk_gbps", r.chunk_gbps}, {"bus_limit_ms", r.bus_limit_ms},
      {"bus_limit_ratio", r.bus_limit_ratio}, {"predicted_ms", r.predicted_ms},
      {"prediction_error", (r.predicted_ms - r.step_ms) / r.step_ms}, {"repeatable", r.repeatable}};
  if (r.bitwise_equal_resident) j["bitwise_equal_resident"] = *r.bitwise_equal_resident;
  if (!r.tc_config.empty()) j["tc_config"] = r.tc_config;
  if (r.shards.size() > 1) {
    j["shards"] = nlohmann::json::array();
    for (const auto& sh : r.shards)
      j["shards"].push_back({{"device", sh.device}, {"kv_head0", sh.kv_head0}, {"kv_heads", sh.kv_heads},
                             {"history_bytes", sh.history_bytes}, {"bytes_per_step", sh.bytes_per_step},
                             {"copies_per_step", sh.copies}, {"copy_rows_per_step", sh.copy_rows},
                             {"largest_copy", sh.largest_copy}});
  }
  j["cpu_share"] = r.cpu_share;
  if (r.cpu_share > 0) {
    j["cpu_bytes_per_step"] = r.cpu_bytes_per_step;
    j["cpu_gbps"] = double(r.cpu_bytes_per_step) / (r.step_ms * 1e6);
    const DecodeEngine::CpuTiming& c = r.cpu_timing;
    if (c.steps > 0) {
      // The planner prices a layer's CPU share at latency + bytes / rate; these
      // say what the steps did: the CPU's rate while busy, and how long it sat
      // between layers waiting on the GPU (partials up, merge, next q down).
      j["cpu_busy_ms_per_step"] = c.busy_ms / double(c.steps);
      j["cpu_idle_ms_per_step"] = c.idle_ms / double(c.steps);
      j["cpu_busy_gbps"] = c.busy_ms > 0 ? double(c.bytes) / (c.busy_ms * 1e6) : 0.0;
      j["cpu_layer_tasks_per_step"] = double(c.layers) / double(c.steps);
    }
    j["predicted_ms_note"] = "with --cpu-share auto in the run: route::predict_co_attention over the rates "
                             "measured at start, with the CPU rates scaled by cpu_rate_scale (the auto row's "
                             "feedback, which runs before the fixed shares of its depth and format); else the GPU "
                             "side's transfer model only";
    if (r.max_rel_diff_vs_resident) j["max_rel_diff_vs_resident"] = *r.max_rel_diff_vs_resident;
    if (r.predicted_link_ms) j["predicted_link_ms"] = *r.predicted_link_ms;
    if (r.predicted_cpu_ms) j["predicted_cpu_ms"] = *r.predicted_cpu_ms;
    if (r.auto_share) {
      j["cpu_share_auto"] = true;
      j["planned_ms"] = r.planned_ms;
      j["plan_error"] = (r.planned_ms - r.step_ms) / r.step_ms;
      j["cpu_feedback_rounds"] = r.feedback_rounds;
    }
    if (r.predicted_cpu_ms) j["cpu_rate_scale"] = r.cpu_rate_scale;
  }
  return j;
}

// The rates the co-attention planner priced every CPU share with (measured
// at start: cuda::measure_co_attention_rates), so that a plan's error can be
// traced to a rate from the JSON alone.
nlohmann::json rates_json(const cuda::CoAttentionCalibration& c) {
  const route::CoAttentionRates& t = c.together;
  nlohmann::json probes = nlohmann::json::array();
  for (const cuda::CoAttentionProbe& p : c.probes)
    probes.push_back({{"name", p.name}, {"cpu_bytes", p.cpu_bytes}, {"streamed_bytes", p.streamed_bytes},
                      {"busy_ms", p.busy_ms}, {"idle_ms", p.idle_ms}, {"step_ms", p.step_ms}});
  return {{"link_alone_gbps", c.link_alone_gbps},
          {"link_with_cpu_gbps", t.link_gbps},
          {"cpu_bf16_alone_gbps", c.cpu_bf16_alone_gbps},
          {"cpu_bf16_with_link_gbps", t.cpu_bf16_gbps},
          {"cpu_int8s_alone_gbps", c.cpu_int8s_alone_gbps},
          {"cpu_int8s_with_link_gbps", t.cpu_int8s_gbps},
          {"cpu_threads", t.cpu_threads},
          {"cpu_layer_latency_ms", t.cpu_layer_latency_ms},
          {"cpu_bf16_fixed_ms", t.cpu_bf16_task_ms},
          {"cpu_int8s_fixed_ms", t.cpu_int8s_task_ms},
          {"rates_note", "cpu_*_with_link and link_with_cpu: the decode engine's co-attention steps (a line through "
                         "two probe sizes); cpu_*_alone: one kernel call over the whole history, not priced"},
          {"resident_bf16_gbps", t.resident_bf16_gbps},
          {"resident_int8s_gbps", t.resident_int8s_gbps},
          {"calibration_history_bytes", c.history_bytes},
          {"probes", probes},
          {"probes_note", "per layer of the probe: the engine's co-attention steps the CPU rates and fixed costs "
                          "were fitted through (small and large per format, then bf16 with the CPU the slower path)"},
          {"describe", c.describe()}};
}

void write_json(std::ofstream& f, const BenchDecodeOptions& opt, const std::map<int, Profile>& profiles,
                double tile_chunk, const HistorySet& hist, const std::vector<Record>& records, double hbm_gbps,
                const std::optional<cuda::CoAttentionCalibration>& calibration) {
  const AttnShape& sh = opt.attn;
  const std::vector<int> devices = run_devices(opt);
  const Profile& pr = profiles.at(devices[0]);
  nlohmann::json links = nlohmann::json::array();
  for (const auto& [d, p] : profiles)
    links.push_back({{"device", d}, {"name", p.device}, {"h2d_gbps_at_tile", p.bandwidth_gbps(tile_chunk)},
                     {"tile_bytes", tile_chunk}, {"profile", p.to_json()}});
  nlohmann::json j = {
      {"gpus", devices},
      {"links", links},
      {"links_note", "one entry per distinct GPU; shards listed on one GPU share its link; a sharded record's "
                     "bus_limit_ms is the slowest GPU's history bytes over its link at a whole tile's copy"},
      {"copy_2d", opt.copy_2d},
      {"device", pr.device},
      {"commit", opt.provenance.commit},
      {"command", opt.provenance.command},
      {"environment", opt.provenance.environment},
      {"shape", {{"n_layers", opt.n_layers}, {"n_kv_heads", sh.n_kv_heads}, {"n_q_heads", sh.n_q_heads()},
                 {"head_dim", sh.head_dim}, {"page_size", sh.page_size}, {"split_tokens", sh.split_tokens},
                 {"tile_pages", opt.tile_pages}, {"ring_slots", opt.ring_slots},
                 {"recent_pages", opt.recent_pages}, {"overlap_formats", opt.overlap_formats}}},
      {"int8s_kernel", {{"kernel", cuda::int8s_kernel_name(cuda::resolve_int8s_kernel(opt.int8s.kernel, opt.attn))}, {"query_terms", opt.int8s.query_terms}, {"skip_unit_rescale", opt.int8s.skip_unit_rescale},
                        {"pow2_reference", opt.int8s.pow2_reference}, {"tensor_cores", opt.int8s.tensor_cores},
                        {"tc_config", cuda::int8s_tc_config_name(cuda::resolve_int8s_tc_config(opt.int8s.tc, sh.head_dim))}}},
      {"conversion_cpu", {{"int8s", conversion_json(hist.int8s_conv)},
                          {"lossless13", conversion_json(hist.lossless13_conv)}}},
      {"profile", pr.to_json()},
      {"records", nlohmann::json::array()},
  };
  if (calibration) j["co_attention_rates"] = rates_json(*calibration);
  if (hbm_gbps > 0) {
    j["hbm_read_gbps"] = hbm_gbps;
    j["hbm_read_note"] = "measure_hbm_read_gbps (bench/gpu/bandwidth.h) on the home GPU before the history; a "
                         "resident record's history_over_hbm = history_bytes / device_ms over it";
  }
  for (const Record& r : records) {
    j["records"].push_back(record_json(r, opt.steps));
    if (hbm_gbps > 0 && r.mode == "resident")
      j["records"].back()["history_over_hbm"] = double(r.history_bytes) / (r.device_ms * 1e6) / hbm_gbps;
  }
  f << j.dump(2) << "\n";
  if (!f.flush()) throw Error("bench decode: writing " + opt.json_path + " failed");
  std::printf("\nJSON written to %s\n", opt.json_path.c_str());
}

// Resident steps against HBM (issue 13): each resident record's history bytes
// over its device time (the compute stream's span of the whole step: every
// layer's launches, merges and the gaps between them), as a share of the
// measured HBM read bandwidth `hbm_gbps`; and batch N in one launch vs N
// batch-1 launches (SPEC §4 batched decode: N = 2, 4, 8).
void print_resident_vs_hbm(const std::vector<Record>& rs, double hbm_gbps) {
  bool header = false;
  for (const Record& rn : rs) {
    if (rn.mode != "resident" || rn.cpu_share != 0) continue;
    if (!header)
      std::printf("\nresident steps against HBM (measured read bandwidth %.0f GB/s), device time per step:\n",
                  hbm_gbps), header = true;
    const double gbps = double(rn.history_bytes) / (rn.device_ms * 1e6);
    std::printf("  %-8s %-7s depth %7lld batch %d: %.3f ms, history at %.0f GB/s = %.2f x HBM", rn.format.c_str(),
                rn.tc_config.c_str(), static_cast<long long>(rn.context), rn.batch, rn.device_ms, gbps,
                gbps / hbm_gbps);
    const Record* r1 = rn.batch > 1 ? find_record(rs, rn.format, "resident", rn.context, 1, rn.tc_config) : nullptr;
    if (r1)
      std::printf("; %d batch-1 launches %.3f ms, one launch / %d launches %.3f", rn.batch, rn.batch * r1->device_ms,
                  rn.batch, rn.device_ms / (rn.batch * r1->device_ms));
    std::printf("\n");
  }
}

}  // namespace

namespace {

// A CPU-shared step may differ from the resident one by fp32 summation order
// and the CPU kernels' rounding: ~1e-6 row-relative (tests/cuda/test_decode.cpp
// bounds both against fp64 at 3.7e-6). Beyond this the bench fails.
constexpr double kMaxCpuShareDiff = 1e-4;
constexpr double kAutoShare = -1;  // --cpu-share auto

// Throws InvalidArgument naming the first bad option.
void check_options(const BenchDecodeOptions& opt) {
  opt.attn.validate();
  for (const auto& m : opt.modes)
    if (m != "streamed" && m != "resident" && m != "streamed-whole")
      throw InvalidArgument("bench decode: unknown mode '" + m + "' (streamed, streamed-whole, resident)");
  for (double f : opt.cpu_shares)
    if (!(f == kAutoShare || (f >= 0 && f < 1)))
      throw InvalidArgument("bench decode: --cpu-share values must be in [0, 1) or auto, got " + std::to_string(f));
  if (opt.cpu_threads < 0) throw InvalidArgument("bench decode: --cpu-threads must be >= 0");
  for (const auto& f : opt.formats)
    if (std::find(route_names().begin(), route_names().end(), f) == route_names().end())
      throw InvalidArgument("bench decode: unknown --kv-format '" + f + "' (bf16, lossless13, int8s, hybrid)");
  if (opt.steps < 1 || opt.warmup < 0) throw InvalidArgument("bench decode: steps must be >= 1, warmup >= 0");
  if (opt.contexts.empty() || opt.batches.empty()) throw InvalidArgument("bench decode: no depths or no batches");
  for (int64_t c : opt.contexts)
    if (c < 1) throw InvalidArgument("bench decode: depths must be >= 1, got " + std::to_string(c));
  for (int b : opt.batches)
    if (b < 1) throw InvalidArgument("bench decode: batch sizes must be >= 1, got " + std::to_string(b));
  if (!opt.gpus.empty()) {
    cuda::plan_head_shards(opt.attn.n_kv_heads, opt.gpus);  // throws for too many shards or a bad device
    if (opt.gpus.size() > 1)
      for (double f : opt.cpu_shares)
        if (f != 0)
          throw InvalidArgument("bench decode: --cpu-share with --gpus of several shards (the CPU attends whole "
                                "pages, not a head shard's heads)");
  }
}

// The largest shard's shape on each distinct device (what its calibration measures).
std::map<int, AttnShape> device_shapes(const BenchDecodeOptions& opt) {
  std::map<int, AttnShape> out;
  for (const cuda::HeadShard& s : cuda::plan_head_shards(opt.attn.n_kv_heads, run_devices(opt))) {
    AttnShape a = opt.attn;
    if (s.kv_heads != a.n_kv_heads) {
      a.page_kv_heads = a.n_kv_heads;
      a.kv_head0 = s.kv_head0;
      a.n_kv_heads = s.kv_heads;
    }
    auto it = out.find(s.device);
    if (it == out.end() || it->second.n_kv_heads < a.n_kv_heads) out[s.device] = a;
  }
  return out;
}

// One engine per mode, reused across configurations (update() per
// configuration). The modes differ by placement and tiles: "resident" reads
// every page from a device copy (ResidentPages, per configuration),
// "streamed" streams every page in tiles of opt.tile_pages, "streamed-whole"
// a layer's pages in one job (tile_pages 0). A mode whose engine cannot be
// made is skipped.
std::map<std::string, std::unique_ptr<ShardedDecodeEngine>> make_engines(const BenchDecodeOptions& opt,
                                                                         const std::vector<std::string>& modes) {
  std::map<std::string, std::unique_ptr<ShardedDecodeEngine>> engines;
  for (const auto& mode : modes) {
    EngineConfig c;
    c.n_layers = opt.n_layers;
    c.attn = opt.attn;
    c.tile_pages = mode == "streamed-whole" ? 0 : opt.tile_pages;
    c.ring_slots = mode == "streamed-whole" ? 2 : opt.ring_slots;
    c.int8s = opt.int8s;
    c.cpu_kernels.threads = opt.cpu_threads > 0 ? opt.cpu_threads : std::max(1, host_threads(0) - 1);
    c.strided_copies = opt.copy_2d;
    c.overlap_formats = opt.overlap_formats;
    try {
      engines[mode] = std::make_unique<ShardedDecodeEngine>(c, run_devices(opt));
    } catch (const CudaError& e) {
      std::printf("  skip mode %s: %s\n", mode.c_str(), e.what());
    }
  }
  return engines;
}

// Outputs of a configuration's measured steps: the first and the last.
struct Timed {
  std::vector<double> ms, device_ms;
  std::vector<float> first, last;
};

// Runs warm-up + measured steps of `eng` (batch already set), timing each on
// the host and by events on the compute stream; the output is poisoned (NaN)
// before every step, so an element a step does not write shows.
Timed time_steps(ShardedDecodeEngine& eng, const BenchDecodeOptions& opt, const DevBuf& q, const DevBuf& out, size_t qn) {
  cudaEvent_t ev[2];
  AKV_CUDA(cudaEventCreate(&ev[0]));
  AKV_CUDA(cudaEventCreate(&ev[1]));
  const std::unique_ptr<cudaEvent_t, void (*)(cudaEvent_t*)> release(ev, [](cudaEvent_t* e) {
    cudaEventDestroy(e[0]);
    cudaEventDestroy(e[1]);
  });
  Timed t;
  for (int i = 0; i < opt.warmup + opt.steps; ++i) {
    AKV_CUDA(cudaMemset(out.p, 0xff, qn * sizeof(float)));
    eng.synchronize();  // every shard's device
    AKV_CUDA(cudaDeviceSynchronize());
    const auto a = std::chrono::steady_clock::now();
    AKV_CUDA(cudaEventRecord(ev[0], eng.compute_stream()));
    eng.enqueue_step(q.as<float>(), out.as<float>(), nullptr);
    AKV_CUDA(cudaEventRecord(ev[1], eng.compute_stream()));
    eng.synchronize();  // all its streams (they end with the compute stream's work); rethrows a CPU-share error
    const auto b = std::chrono::steady_clock::now();
    float dev = 0;
    AKV_CUDA(cudaEventElapsedTime(&dev, ev[0], ev[1]));
    if (i + 1 == opt.warmup) eng.engine(0).reset_cpu_timing();  // the measured steps' only
    if (i >= opt.warmup) {
      t.ms.push_back(std::chrono::duration<double, std::milli>(b - a).count());
      t.device_ms.push_back(dev);
    }
    if (i == opt.warmup || i == opt.warmup + opt.steps - 1) {
      std::vector<float>& dst = i == opt.warmup ? t.first : t.last;
      dst.resize(qn);
      AKV_CUDA(cudaMemcpy(dst.data(), out.p, qn * sizeof(float), cudaMemcpyDeviceToHost));
    }
  }
  return t;
}

// Bytes the step's pages take across the bus: what the streamed jobs copy,
// and for the resident pages of `tables` (the batch the engine was given)
// what streaming them would move (each page 256-byte aligned, as staged).
// A head shard's resident bytes are its heads' ranges (resident_bytes_per_step).
uint64_t history_bytes(const DecodeEngine& eng, const std::vector<SeqPages>& tables, int n_layers) {
  if (eng.config().attn.sharded()) return eng.bytes_per_step() + eng.resident_bytes_per_step();
  uint64_t bytes = 0;
  bool any_resident = false;
  for (int l = 0; l < n_layers; ++l)
    for (const auto& ji : eng.job_info(l)) {
      any_resident = any_resident || ji.resident;
      for (size_t b : ji.copy_bytes) bytes += b;  // none for the resident job
    }
  if (any_resident)
    for (const auto& s : tables)
      for (const auto& t : s.tables)
        for (const auto& p : t)
          if (p.device) bytes += (p.bytes + 255) / 256 * 256;
  return bytes;
}

// Device copies of every page of `seqs` on the current device (one slot per
// entry, slots of the largest page). Throws CudaError naming the bytes when they do not fit.
std::unique_ptr<cuda::ResidentPages> device_copies(const std::vector<SeqPages>& seqs) {
  size_t slot = 0, n = 0;
  for (const auto& s : seqs)
    for (const auto& t : s.tables)
      for (const auto& p : t) {
        slot = std::max<size_t>(slot, p.bytes);
        ++n;
      }
  return std::make_unique<cuda::ResidentPages>(slot, n);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Largest |a - ref| of a row (head_dim values) over that row's largest |ref|.
double max_row_rel_diff(const std::vector<float>& a, const std::vector<float>& ref, int head_dim) {
  double worst = 0;
  for (size_t row = 0; row + size_t(head_dim) <= ref.size(); row += size_t(head_dim)) {
    double mx = 0, d = 0;
    for (int i = 0; i < head_dim; ++i) {
      mx = std::max(mx, double(std::fabs(ref[row + i])));
      d = std::max(d, double(std::fabs(a[row + i] - ref[row + i])));
    }
    if (!std::isfinite(d)) return INFINITY;
    worst = std::max(worst, d / std::max(mx, 1e-30));
  }
  return worst;
}

// Parsed views of every int8s page (the CPU attends int8s pages through them),
// keyed by the blob's host address. Parsing validates each blob once.
using Int8sViews = std::unordered_map<const std::byte*, kv::Int8sPageView>;
Int8sViews parse_int8s_views(const HistorySet& h, int threads) {
  std::vector<const PageRef*> refs;
  for (const auto& seq : h.int8s)
    for (const auto& layer : seq)
      for (const PageRef& r : layer) refs.push_back(&r);
  std::vector<kv::Int8sPageView> views(refs.size());
  parallel_for(refs.size(), threads, [&](size_t i) {
    views[i] = kv::parse_int8s_page(std::span<const std::byte>(refs[i]->host, refs[i]->bytes));
  });
  Int8sViews out;
  for (size_t i = 0; i < refs.size(); ++i) out.emplace(refs[i]->host, views[i]);
  return out;
}

// CPU pages per (sequence, layer) for a fixed share: round(share x pages),
// never the tail page.
size_t pages_for_share(double share, size_t n_pages) {
  return n_pages == 0 ? 0 : std::min(n_pages - 1, size_t(std::lround(share * double(n_pages))));
}

// Marks the oldest `n` pages the CPU can read in each (sequence, layer) --
// never a lossless13 page (the CPU does not unpack) -- as attended by the CPU
// in place.
void apply_cpu_pages(std::vector<SeqPages>& tables, size_t n, const Int8sViews& views) {
  if (n == 0) return;
  for (SeqPages& s : tables)
    for (auto& t : s.tables) {
      for (size_t p = 0, given = 0; p < t.size() && given < n; ++p) {
        PageRef& r = t[p];
        if (r.kind == PageKind::lossless13) continue;
        if (r.kind == PageKind::int8s) {
          const auto it = views.find(r.host);
          if (it == views.end()) throw Error("bench decode: an int8s page without its parsed view");
          r.int8s_view = &it->second;
        }
        r.cpu = true;
        r.device = nullptr;
        ++given;
      }
    }
}

// --cpu-share auto as the runtime runs it (history_view.cpp): `rounds`
// rounds of 2 steps at the plan so far, each correcting the CPU rates from
// the engine's measured CPU tasks, then planning again. Leaves the engine
// on the last round's tables; returns the final plan.
route::CoAttentionPlan learn_cpu_rate(ShardedDecodeEngine& eng, const std::vector<SeqPages>& placed,
                                      const Int8sViews& views, route::CoAttentionPlan plan, route::CpuRateFeedback& fb,
                                      int n_layers, int rounds, double link_alone_gbps, const DevBuf& q,
                                      const DevBuf& out) {
  const std::vector<route::PlanPage> layer = cuda::plan_pages(placed[0].tables[0]);
  for (int round = 0; round < rounds; ++round) {
    std::vector<SeqPages> tables = placed;
    apply_cpu_pages(tables, plan.cpu_pages, views);
    eng.update(tables);
    eng.engine(0).reset_cpu_timing();
    for (int i = 0; i < 2; ++i) {
      eng.enqueue_step(q.as<float>(), out.as<float>(), nullptr);
      eng.synchronize();
    }
    const DecodeEngine::CpuTiming t = eng.engine(0).cpu_timing();
    fb.observe(t.busy_ms, double(t.bytes), t.layers, plan);
    plan = route::plan_co_attention(layer, n_layers, fb.rates(), link_alone_gbps);
  }
  return plan;
}

}  // namespace

int run_bench_decode(const BenchDecodeOptions& opt) {
  check_options(opt);
  const AttnShape& sh = opt.attn;
  const std::vector<int> devices = run_devices(opt);
  const int home = devices[0];
  for (const auto& [d, a] : device_shapes(opt)) cuda::require_gpu(d, "bench decode");  // after the arguments:
  cuda::require_gpu(home, "bench decode");  // a typo is reported on any machine; the home device is current
  std::ofstream json_file = open_output(opt.json_path, "bench decode");
  const int threads = host_threads(opt.host_threads);
  auto wants = [&](const char* f) { return std::find(opt.formats.begin(), opt.formats.end(), f) != opt.formats.end(); };

  // Each distinct device's link and kernels (the largest shard's heads on it).
  std::map<int, Profile> profiles;
  for (const auto& [d, a] : device_shapes(opt)) {
    CalibrateOptions copt;
    copt.attn = a;
    copt.out_path = d == home ? opt.profile_path : "";
    copt.device = d;
    copt.int8s = opt.int8s;  // the predicted times use the kernel the bench runs
    copt.provenance = opt.provenance;
    profiles[d] = calibrate(copt);
  }
  cuda::require_gpu(home, "bench decode");
  const Profile& pr = profiles.at(home);
  // Resident steps are held against the HBM read bandwidth, measured here
  // while the device holds no history yet (a quarter of its free memory, at most 4 GiB).
  double hbm_gbps = 0;
  if (std::find(opt.modes.begin(), opt.modes.end(), "resident") != opt.modes.end()) {
    size_t free = 0, total = 0;
    AKV_CUDA(cudaMemGetInfo(&free, &total));
    hbm_gbps = measure_hbm_read_gbps(std::min(size_t(4) << 30, free / 4), 10);
    std::printf("HBM read bandwidth: %.0f GB/s (GPU %d)\n", hbm_gbps, home);
  }
  // The bus limit of a sharded step: each device's bytes over its link at a
  // whole tile's copy (the unsharded engine's copy size), the slowest device.
  const double tile_chunk = double(std::max(opt.tile_pages, 1)) * double(sh.page_bytes());
  const auto shards = cuda::plan_head_shards(sh.n_kv_heads, devices);
  if (shards.size() > 1) {
    std::printf("\nhead shards (--gpus):");
    for (const auto& s : shards)
      std::printf(" [GPU %d: KV heads %d..%d]", s.device, s.kv_head0, s.kv_head0 + s.kv_heads - 1);
    std::printf("\n  links:");
    for (const auto& [d, p] : profiles)
      std::printf(" GPU %d %.1f GB/s (%s)", d, p.bandwidth_gbps(tile_chunk), p.device.c_str());
    std::printf("\n  shards on one GPU share its link; the bus limit is the slowest GPU's bytes over its link\n");
  }

  const int64_t max_ctx = *std::max_element(opt.contexts.begin(), opt.contexts.end());
  const int max_batch = *std::max_element(opt.batches.begin(), opt.batches.end());
  std::printf("\nbench decode: %d layers, %d KV heads x %d, %d query heads, page %d tokens (bf16 %.1f MiB), "
              "kv-formats", opt.n_layers, sh.n_kv_heads, sh.head_dim, sh.n_q_heads(), sh.page_size,
              sh.page_bytes() / 1048576.0);
  for (const auto& f : opt.formats) std::printf(" %s", f.c_str());
  std::printf("\n");
  const auto t0 = std::chrono::steady_clock::now();
  const HistorySet hist = build_history(sh, opt.n_layers, max_batch, max_ctx, wants("int8s") || wants("hybrid"),
                                        wants("lossless13"), threads);
  std::printf("  history ready in %.1f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());

  std::vector<std::string> modes{"resident"};  // first: the bitwise reference for the streamed modes
  for (const auto& m : opt.modes)
    if (m != "resident") modes.push_back(m);
  const bool want_resident = std::find(opt.modes.begin(), opt.modes.end(), "resident") != opt.modes.end();
  // tc launch configurations (--int8s-tc-config): engines of their own; the
  // formats without int8s pages run with the first only.
  std::vector<Int8sTcConfig> tc_configs = opt.tc_configs;
  if (tc_configs.empty()) tc_configs.push_back(opt.int8s.tc);
  const bool tc_runs = cuda::resolve_int8s_kernel(opt.int8s.kernel, sh) == cuda::Int8sKernel::tc;

  // Shares: 0 first (the resident run at 0 is every configuration's reference).
  std::vector<double> shares{0.0};
  for (double f : opt.cpu_shares)
    if (f != 0 && std::find(shares.begin(), shares.end(), f) == shares.end()) shares.push_back(f);
  // auto right after 0: the CPU rates its steps measured then price the
  // fixed shares' predictions too (the planner's model with the rates it plans with).
  if (auto a = std::find(shares.begin(), shares.end(), kAutoShare); a != shares.end())
    std::rotate(shares.begin() + 1, a, a + 1);
  std::optional<cuda::CoAttentionCalibration> calibration;
  if (std::find(shares.begin(), shares.end(), kAutoShare) != shares.end()) {
    const int cpu_threads = opt.cpu_threads > 0 ? opt.cpu_threads : std::max(1, threads - 1);
    calibration = cuda::measure_co_attention_rates(sh, cpu_threads);
    std::printf("  co-attention rates: %s\n", calibration->describe().c_str());
  }
  const bool want_share0 = std::find(opt.cpu_shares.begin(), opt.cpu_shares.end(), 0.0) != opt.cpu_shares.end();
  Int8sViews views;
  if (shares.size() > 1 && !hist.int8s.empty()) {
    const auto tv = std::chrono::steady_clock::now();
    views = parse_int8s_views(hist, threads);
    std::printf("  %zu int8s pages parsed for the CPU in %.1f s\n", views.size(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - tv).count());
  }

  std::vector<Record> records;
  bool all_ok = true;
  for (size_t ci = 0; ci < tc_configs.size(); ++ci) {
    BenchDecodeOptions copt = opt;
    copt.int8s.tc = tc_configs[ci];
    const std::string tc_name =
        tc_runs ? cuda::int8s_tc_config_name(cuda::resolve_int8s_tc_config(copt.int8s.tc, sh.head_dim)) : "";
    if (tc_configs.size() > 1) std::printf("\n  tc kernel configuration %s\n", tc_name.c_str());
    auto engines = make_engines(copt, modes);
    for (const auto& format : opt.formats) {
      const bool reads_int8s = format == "int8s" || format == "hybrid";
      if (ci > 0 && !reads_int8s) continue;
      for (int batch : opt.batches) {
        for (int64_t ctx : opt.contexts) {
          const std::vector<SeqPages> seqs =
              route_tables(hist, format, batch, ctx, opt.n_layers, sh.page_size, opt.recent_pages);
          const size_t qn = size_t(opt.n_layers) * batch * sh.n_q_heads() * sh.head_dim;
          DevBuf q(qn * sizeof(float), "bench decode: queries"), out(qn * sizeof(float), "bench decode: outputs");
          fill_device_random(q.as<float>(), qn, uint64_t(ctx) * 31 + batch);
          std::vector<float> ref;  // the resident output of this configuration
          const int64_t splits = (ctx + sh.split_tokens - 1) / sh.split_tokens;
          for (const auto& mode : modes) {
            if (!engines.count(mode)) continue;
            ShardedDecodeEngine& eng = *engines[mode];
            const bool streamed = mode != "resident";
            // resident: this configuration's pages on each GPU, and the batch as that GPU's shards read it
            std::map<int, std::unique_ptr<cuda::ResidentPages>> copies;
            std::map<int, std::vector<SeqPages>> placed_on;
            std::vector<SeqPages> placed;  // the batch as the home GPU reads it, no CPU share
            try {
              if (!streamed)
                for (const auto& [d, p] : profiles) {
                  AKV_CUDA(cudaSetDevice(d));
                  copies[d] = device_copies(seqs);
                  placed_on[d] = copies[d]->place(seqs);
                }
              AKV_CUDA(cudaSetDevice(home));
              placed = streamed ? seqs : placed_on[home];
            } catch (const CudaError& e) {
              AKV_CUDA(cudaSetDevice(home));
              std::printf("  skip %s %s depth %lld batch %d: %s\n", format.c_str(), mode.c_str(),
                          static_cast<long long>(ctx), batch, e.what());
              continue;
            }
            std::optional<route::CpuRateFeedback> feedback;  // auto's: the CPU rates its steps measured
            for (double share : shares) {
              std::vector<SeqPages> tables = placed;
              std::optional<route::CoAttentionPlan> plan;
              if (share == kAutoShare) {  // sequences alike: one plan, applied to each
                plan = route::plan_co_attention(cuda::plan_pages(placed[0].tables[0]), opt.n_layers, calibration->together,
                                                calibration->link_alone_gbps);
                if (opt.cpu_feedback_rounds > 0 && shards.size() == 1) {
                  feedback.emplace(calibration->together);
                  try {
                    plan = learn_cpu_rate(eng, placed, views, *plan, *feedback, opt.n_layers, opt.cpu_feedback_rounds,
                                          calibration->link_alone_gbps, q, out);
                  } catch (const CudaError& e) {
                    std::printf("  skip %s %s depth %lld batch %d: %s\n", format.c_str(), mode_label(mode, share).c_str(),
                                static_cast<long long>(ctx), batch, e.what());
                    continue;
                  }
                }
              }
              const size_t n_cpu = plan ? plan->cpu_pages : pages_for_share(share, placed[0].tables[0].size());
              apply_cpu_pages(tables, n_cpu, views);
              std::vector<std::vector<SeqPages>> per_shard;  // (a CPU share: one shard only, check_options)
              for (const auto& s : shards) per_shard.push_back(streamed || shards.size() == 1 ? tables : placed_on[s.device]);
              try {
                eng.update(per_shard);
              } catch (const CudaError& e) {
                std::printf("  skip %s %s depth %lld batch %d: %s\n", format.c_str(), mode_label(mode, share).c_str(),
                            static_cast<long long>(ctx), batch, e.what());
                continue;
              }
              const Timed t = time_steps(eng, opt, q, out, qn);
              if (!streamed && share == 0) ref = t.first;
              if (!streamed && !want_resident) continue;  // measured only as the reference
              if (share == 0 && !want_share0) continue;
              Record r{};
              if (reads_int8s) r.tc_config = tc_name;
              r.format = format;
              r.mode = mode;
              r.context = ctx;
              r.batch = batch;
              r.cpu_share = share;
              r.auto_share = plan.has_value();
              if (plan) {
                r.cpu_share = plan->share;
                r.planned_ms = plan->predicted_ms;
                std::printf("  plan: %s%s\n", plan->describe().c_str(),
                            feedback ? ("; " + feedback->describe()).c_str() : "");
              }
              r.cpu_bytes_per_step = eng.engine(0).cpu_bytes_per_step();
              r.cpu_timing = eng.engine(0).cpu_timing();
              r.step_ms = median(t.ms);
              r.device_ms = median(t.device_ms);
              r.step_ms_min = *std::min_element(t.ms.begin(), t.ms.end());
              r.step_ms_max = *std::max_element(t.ms.begin(), t.ms.end());
              std::map<int, uint64_t> device_bytes;  // history bytes over each GPU's link
              for (int i = 0; i < eng.n_shards(); ++i) {
                const DecodeEngine& e = eng.engine(i);
                const cuda::HeadShard& hs = eng.shard(i);
                const uint64_t hb = history_bytes(e, per_shard[size_t(i)], opt.n_layers);
                r.history_bytes += hb;
                device_bytes[hs.device] += hb;
                r.shards.push_back({hs.device, hs.kv_head0, hs.kv_heads, hb, e.bytes_per_step(), e.copies_per_step(),
                                    e.copy_rows_per_step(), e.largest_copy()});
              }
              r.bytes_per_step = eng.bytes_per_step();
              r.copies_per_step = eng.copies_per_step();
              r.copy_rows_per_step = eng.copy_rows_per_step();
              r.largest_copy = eng.largest_copy();
              r.jobs_per_layer = eng.engine(0).jobs_in_layer(0);
              r.gbps = double(r.history_bytes + r.cpu_bytes_per_step) / (r.step_ms * 1e6);
              if (eng.n_shards() == 1) {
                const double chunk = streamed ? double(eng.largest_copy()) : double(opt.tile_pages) * sh.page_bytes();
                r.chunk_gbps = pr.bandwidth_gbps(chunk);
                r.bus_limit_ms = double(r.history_bytes) / (r.chunk_gbps * 1e6);
              } else {  // the slowest GPU; chunk_gbps: the links together
                for (const auto& [d, b] : device_bytes) {
                  const double gbps = profiles.at(d).bandwidth_gbps(tile_chunk);
                  r.chunk_gbps += gbps;
                  r.bus_limit_ms = std::max(r.bus_limit_ms, double(b) / (gbps * 1e6));
                }
              }
              r.bus_limit_ratio = r.step_ms / r.bus_limit_ms;
              r.predicted_ms = predict_ms(profiles, eng, opt.n_layers, splits);
              if (calibration && share != 0) {  // the co-attention model: link and CPU side by side
                const route::CoAttentionPlan p = route::predict_co_attention(
                    cuda::plan_pages(placed[0].tables[0]), opt.n_layers, feedback ? feedback->rates() : calibration->together,
                    calibration->link_alone_gbps, n_cpu);
                r.predicted_ms = p.predicted_ms;
                r.predicted_link_ms = p.link_ms;
                r.predicted_cpu_ms = p.cpu_ms;
                if (feedback) r.cpu_rate_scale = feedback->scale();
                if (plan && feedback) r.feedback_rounds = opt.cpu_feedback_rounds;
              }
              if (n_cpu > 0 && !ref.empty()) {  // CPU partials (a share, or auto's): fp32 order, not the same bits
                r.max_rel_diff_vs_resident = max_row_rel_diff(t.first, ref, sh.head_dim);
              } else if (streamed && !ref.empty()) {
                r.bitwise_equal_resident = same_bits(ref, t.first);
              }
              r.repeatable = same_bits(t.first, t.last);
              const bool finite = std::all_of(t.first.begin(), t.first.end(), [](float v) { return std::isfinite(v); });
              const bool close = !r.max_rel_diff_vs_resident || *r.max_rel_diff_vs_resident <= kMaxCpuShareDiff;
              if (r.bitwise_equal_resident == false || !close || !r.repeatable || !finite) all_ok = false;
              records.push_back(r);
              char vs[64];
              if (r.max_rel_diff_vs_resident)
                std::snprintf(vs, sizeof vs, "max rel diff vs resident %.2e%s", *r.max_rel_diff_vs_resident,
                              close ? "" : " (TOO LARGE)");
              else
                std::snprintf(vs, sizeof vs, "bitwise==resident %s",
                              !streamed ? "reference" : !r.bitwise_equal_resident ? "n/a (no resident run)"
                                                      : (*r.bitwise_equal_resident ? "yes" : "NO"));
              std::printf("  %-10s %-15s depth %7lld batch %d: %9.3f ms (min %.3f max %.3f, device %.3f), pred %.3f ms, "
                          "bus %.3f ms, ratio %.3f, %s, repeatable %s%s\n",
                          (r.tc_config.empty() ? format : format + "/" + r.tc_config).c_str(),
                          mode_label(mode, r.cpu_share, r.auto_share).c_str(),
                          static_cast<long long>(ctx), batch, r.step_ms, r.step_ms_min, r.step_ms_max, r.device_ms, r.predicted_ms, r.bus_limit_ms,
                          r.bus_limit_ratio, vs, r.repeatable ? "yes" : "NO", finite ? "" : ", OUTPUT NOT FINITE");
              if (streamed && r.copies_per_step > 0)
                std::printf("    copies: %llu per step of %.3f MiB on average (%llu contiguous rows of %.3f MiB), "
                            "largest %.3f MiB\n",
                            static_cast<unsigned long long>(r.copies_per_step),
                            double(r.bytes_per_step) / double(r.copies_per_step) / 1048576.0,
                            static_cast<unsigned long long>(r.copy_rows_per_step),
                            double(r.bytes_per_step) / double(r.copy_rows_per_step) / 1048576.0,
                            double(r.largest_copy) / 1048576.0);
              if (r.shards.size() > 1)
                for (const auto& hs : r.shards)
                  std::printf("    shard GPU %d heads %d..%d: %.1f MiB history, %llu copies\n", hs.device, hs.kv_head0,
                              hs.kv_head0 + hs.kv_heads - 1, double(hs.history_bytes) / 1048576.0,
                              static_cast<unsigned long long>(hs.copies));
              std::fflush(stdout);
            }
          }
        }
      }
    }
  }
  print_table(records);
  if (hbm_gbps > 0) print_resident_vs_hbm(records, hbm_gbps);
  if (json_file.is_open()) write_json(json_file, opt, profiles, tile_chunk, hist, records, hbm_gbps, calibration);
  return all_ok ? 0 : 1;
}

}  // namespace activekv::gpu_bench
