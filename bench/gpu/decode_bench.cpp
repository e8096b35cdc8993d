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
#include "bench_pages.h"
#include "bench_util.h"
#include "gpu_bench.h"

namespace activekv::gpu_bench {

using cuda::DecodeEngine;
using cuda::EngineConfig;

namespace {

struct Record {
  std::string format, mode;
  int64_t context;
  int batch;
  double step_ms, step_ms_min, step_ms_max;
  double device_ms;        // compute-stream span of the step (cudaEvent), median
  uint64_t history_bytes;  // bytes the step's pages take across the bus (also for resident: what streaming would move)
  uint64_t bytes_per_step;
  double gbps, bus_limit_ms, bus_limit_ratio, predicted_ms, chunk_gbps;
  uint64_t copies_per_step, largest_copy;
  int jobs_per_layer;
  // Streamed records: output bitwise equal to the resident run's. Absent for
  // resident records: they are the reference.
  std::optional<bool> bitwise_equal_resident;
  // Co-attention: the share of pages the CPU attends, the bytes it reads, and
  // the largest row-relative difference from the resident reference.
  double cpu_share = 0;
  bool auto_share = false;  // the planner chose the share (--cpu-share auto)
  double planned_ms = 0;    // its predicted step
  uint64_t cpu_bytes_per_step = 0;
  std::optional<double> max_rel_diff_vs_resident;
  bool repeatable;
};

double predict_ms(const Profile& pr, const DecodeEngine& eng, int n_layers, int64_t splits_per_seq) {
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
        for (size_t b : jobs[j].copy_bytes) t += pr.copy_time_ms(double(b));
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

std::string mode_label(const std::string& mode, double cpu_share, bool auto_share = false) {
  if (auto_share) return mode + "+cpu-auto";
  if (cpu_share <= 0) return mode;
  char buf[32];
  std::snprintf(buf, sizeof buf, "+cpu%.0f%%", 100 * cpu_share);
  return mode + buf;
}

void print_table(const std::vector<Record>& records) {
  // llama-bench vocabulary: depth = context tokens, t/s = tokens generated per second.
  std::printf("\n| %-10s | %-15s | %7s | %5s | %9s | %17s | %8s | %9s | %6s | %9s | %6s |\n", "kv-format", "mode",
              "depth", "batch", "step ms", "min - max", "t/s", "bus ms", "ratio", "pred ms", "err %");
  std::printf("|%s|\n", std::string(130, '-').c_str());
  for (const auto& r : records)
    std::printf("| %-10s | %-15s | %7lld | %5d | %9.3f | %8.3f - %6.3f | %8.2f | %9.3f | %6.3f | %9.3f | %6.2f |\n",
                r.format.c_str(), mode_label(r.mode, r.cpu_share, r.auto_share).c_str(), static_cast<long long>(r.context), r.batch, r.step_ms,
                r.step_ms_min, r.step_ms_max, r.batch * 1000.0 / r.step_ms, r.bus_limit_ms, r.bus_limit_ratio,
                r.predicted_ms, 100.0 * (r.predicted_ms - r.step_ms) / r.step_ms);
}

const Record* find_record(const std::vector<Record>& rs, const std::string& f, const std::string& m, int64_t ctx,
                          int batch) {
  for (const Record& r : rs)
    if (r.format == f && r.mode == m && r.context == ctx && r.batch == batch) return &r;
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
      {"jobs_per_layer", r.jobs_per_layer}, {"chunk_gbps", r.chunk_gbps}, {"bus_limit_ms", r.bus_limit_ms},
      {"bus_limit_ratio", r.bus_limit_ratio}, {"predicted_ms", r.predicted_ms},
      {"prediction_error", (r.predicted_ms - r.step_ms) / r.step_ms}, {"repeatable", r.repeatable}};
  if (r.bitwise_equal_resident) j["bitwise_equal_resident"] = *r.bitwise_equal_resident;
  j["cpu_share"] = r.cpu_share;
  if (r.cpu_share > 0) {
    j["cpu_bytes_per_step"] = r.cpu_bytes_per_step;
    j["cpu_gbps"] = double(r.cpu_bytes_per_step) / (r.step_ms * 1e6);
    j["predicted_ms_note"] = "with --cpu-share auto in the run: route::predict_co_attention over the rates "
                             "measured at start; else the GPU side's transfer model only";
    if (r.max_rel_diff_vs_resident) j["max_rel_diff_vs_resident"] = *r.max_rel_diff_vs_resident;
    if (r.auto_share) {
      j["cpu_share_auto"] = true;
      j["planned_ms"] = r.planned_ms;
      j["plan_error"] = (r.planned_ms - r.step_ms) / r.step_ms;
    }
  }
  return j;
}

void write_json(std::ofstream& f, const BenchDecodeOptions& opt, const Profile& pr, const HistorySet& hist,
                const std::vector<Record>& records) {
  const AttnShape& sh = opt.attn;
  nlohmann::json j = {
      {"device", pr.device},
      {"commit", opt.provenance.commit},
      {"command", opt.provenance.command},
      {"shape", {{"n_layers", opt.n_layers}, {"n_kv_heads", sh.n_kv_heads}, {"n_q_heads", sh.n_q_heads()},
                 {"head_dim", sh.head_dim}, {"page_size", sh.page_size}, {"split_tokens", sh.split_tokens},
                 {"tile_pages", opt.tile_pages}, {"ring_slots", opt.ring_slots},
                 {"recent_pages", opt.recent_pages}}},
      {"int8s_kernel", {{"kernel", cuda::int8s_kernel_name(opt.int8s.kernel)}, {"query_terms", opt.int8s.query_terms}, {"skip_unit_rescale", opt.int8s.skip_unit_rescale},
                        {"pow2_reference", opt.int8s.pow2_reference}, {"tensor_cores", opt.int8s.tensor_cores}}},
      {"conversion_cpu", {{"int8s", conversion_json(hist.int8s_conv)},
                          {"lossless13", conversion_json(hist.lossless13_conv)}}},
      {"profile", pr.to_json()},
      {"records", nlohmann::json::array()},
  };
  for (const Record& r : records) j["records"].push_back(record_json(r, opt.steps));
  f << j.dump(2) << "\n";
  if (!f.flush()) throw Error("bench decode: writing " + opt.json_path + " failed");
  std::printf("\nJSON written to %s\n", opt.json_path.c_str());
}

// Batch 2 in one launch vs two batch-1 launches (SPEC §4 batched decode), resident device time.
void print_batching(const std::vector<Record>& rs) {
  bool header = false;
  for (const Record& r2 : rs) {
    if (r2.mode != "resident" || r2.batch != 2) continue;
    const Record* r1 = find_record(rs, r2.format, "resident", r2.context, 1);
    if (!r1) continue;
    if (!header) std::printf("\nbatched decode, resident device time per step (16 layers):\n"), header = true;
    std::printf("  %-10s depth %7lld: batch 2 in one launch %.3f ms, two batch-1 launches %.3f ms (ratio %.3f)\n",
                r2.format.c_str(), static_cast<long long>(r2.context), r2.device_ms, 2 * r1->device_ms,
                r2.device_ms / (2 * r1->device_ms));
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
}

// One engine per mode, reused across configurations (update() per
// configuration). The modes differ by placement and tiles: "resident" reads
// every page from a device copy (ResidentPages, per configuration),
// "streamed" streams every page in tiles of opt.tile_pages, "streamed-whole"
// a layer's pages in one job (tile_pages 0). A mode whose engine cannot be
// made is skipped.
std::map<std::string, std::unique_ptr<DecodeEngine>> make_engines(const BenchDecodeOptions& opt,
                                                                  const std::vector<std::string>& modes) {
  std::map<std::string, std::unique_ptr<DecodeEngine>> engines;
  for (const auto& mode : modes) {
    EngineConfig c;
    c.n_layers = opt.n_layers;
    c.attn = opt.attn;
    c.tile_pages = mode == "streamed-whole" ? 0 : opt.tile_pages;
    c.ring_slots = mode == "streamed-whole" ? 2 : opt.ring_slots;
    c.int8s = opt.int8s;
    c.cpu_kernels.threads = opt.cpu_threads > 0 ? opt.cpu_threads : std::max(1, host_threads(0) - 1);
    try {
      engines[mode] = std::make_unique<DecodeEngine>(c);
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
Timed time_steps(DecodeEngine& eng, const BenchDecodeOptions& opt, const DevBuf& q, const DevBuf& out, size_t qn) {
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
    eng.synchronize();
    AKV_CUDA(cudaDeviceSynchronize());
    const auto a = std::chrono::steady_clock::now();
    AKV_CUDA(cudaEventRecord(ev[0], eng.compute_stream()));
    eng.enqueue_step(q.as<float>(), out.as<float>(), nullptr);
    AKV_CUDA(cudaEventRecord(ev[1], eng.compute_stream()));
    eng.synchronize();  // all its streams (they end with the compute stream's work); rethrows a CPU-share error
    const auto b = std::chrono::steady_clock::now();
    float dev = 0;
    AKV_CUDA(cudaEventElapsedTime(&dev, ev[0], ev[1]));
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
uint64_t history_bytes(const DecodeEngine& eng, const std::vector<SeqPages>& tables, int n_layers) {
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

// Device copies of every page of `seqs` (one slot per entry, slots of the
// largest page). Throws CudaError naming the bytes when they do not fit.
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

}  // namespace

int run_bench_decode(const BenchDecodeOptions& opt) {
  check_options(opt);
  const AttnShape& sh = opt.attn;
  cuda::require_gpu(opt.device, "bench decode");  // after the arguments: a typo is reported on any machine
  std::ofstream json_file = open_output(opt.json_path, "bench decode");
  const int threads = host_threads(opt.host_threads);
  auto wants = [&](const char* f) { return std::find(opt.formats.begin(), opt.formats.end(), f) != opt.formats.end(); };

  CalibrateOptions copt;
  copt.attn = sh;
  copt.out_path = opt.profile_path;
  copt.device = opt.device;
  copt.int8s = opt.int8s;  // the predicted times use the kernel the bench runs
  copt.provenance = opt.provenance;
  const Profile pr = calibrate(copt);

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
  auto engines = make_engines(opt, modes);

  // Shares: 0 first (the resident run at 0 is every configuration's reference).
  std::vector<double> shares{0.0};
  for (double f : opt.cpu_shares)
    if (f != 0 && std::find(shares.begin(), shares.end(), f) == shares.end()) shares.push_back(f);
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
  for (const auto& format : opt.formats) {
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
          DecodeEngine& eng = *engines[mode];
          const bool streamed = mode != "resident";
          std::unique_ptr<cuda::ResidentPages> copies;  // resident: this configuration's pages on the GPU
          std::vector<SeqPages> placed;                 // the batch as the engine reads it, no CPU share
          try {
            if (!streamed) copies = device_copies(seqs);
            placed = streamed ? seqs : copies->place(seqs);
          } catch (const CudaError& e) {
            std::printf("  skip %s %s depth %lld batch %d: %s\n", format.c_str(), mode.c_str(),
                        static_cast<long long>(ctx), batch, e.what());
            continue;
          }
          for (double share : shares) {
            std::vector<SeqPages> tables = placed;
            std::optional<route::CoAttentionPlan> plan;
            if (share == kAutoShare)  // sequences alike: one plan, applied to each
              plan = route::plan_co_attention(cuda::plan_pages(placed[0].tables[0]), opt.n_layers, calibration->together,
                                              calibration->link_alone_gbps);
            const size_t n_cpu = plan ? plan->cpu_pages : pages_for_share(share, placed[0].tables[0].size());
            apply_cpu_pages(tables, n_cpu, views);
            try {
              eng.update(tables);
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
            r.format = format;
            r.mode = mode;
            r.context = ctx;
            r.batch = batch;
            r.cpu_share = share;
            r.auto_share = plan.has_value();
            if (plan) {
              r.cpu_share = plan->share;
              r.planned_ms = plan->predicted_ms;
              std::printf("  plan: %s\n", plan->describe().c_str());
            }
            r.cpu_bytes_per_step = eng.cpu_bytes_per_step();
            r.step_ms = median(t.ms);
            r.device_ms = median(t.device_ms);
            r.step_ms_min = *std::min_element(t.ms.begin(), t.ms.end());
            r.step_ms_max = *std::max_element(t.ms.begin(), t.ms.end());
            r.history_bytes = history_bytes(eng, tables, opt.n_layers);
            r.bytes_per_step = eng.bytes_per_step();
            r.copies_per_step = eng.copies_per_step();
            r.largest_copy = eng.largest_copy();
            r.jobs_per_layer = eng.jobs_in_layer(0);
            r.gbps = double(r.history_bytes + r.cpu_bytes_per_step) / (r.step_ms * 1e6);
            const double chunk = streamed ? double(eng.largest_copy()) : double(opt.tile_pages) * sh.page_bytes();
            r.chunk_gbps = pr.bandwidth_gbps(chunk);
            r.bus_limit_ms = double(r.history_bytes) / (r.chunk_gbps * 1e6);
            r.bus_limit_ratio = r.step_ms / r.bus_limit_ms;
            r.predicted_ms = predict_ms(pr, eng, opt.n_layers, splits);
            if (calibration && share != 0)  // the co-attention model: link and CPU side by side
              r.predicted_ms = route::predict_co_attention(cuda::plan_pages(placed[0].tables[0]), opt.n_layers,
                                                           calibration->together, calibration->link_alone_gbps,
                                                           n_cpu).predicted_ms;
            if (share > 0 && !ref.empty()) {
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
                        format.c_str(), mode_label(mode, r.cpu_share, r.auto_share).c_str(),
                        static_cast<long long>(ctx), batch, r.step_ms, r.step_ms_min, r.step_ms_max, r.device_ms, r.predicted_ms, r.bus_limit_ms,
                        r.bus_limit_ratio, vs, r.repeatable ? "yes" : "NO", finite ? "" : ", OUTPUT NOT FINITE");
            std::fflush(stdout);
          }
        }
      }
    }
  }
  print_table(records);
  print_batching(records);
  if (json_file.is_open()) write_json(json_file, opt, pr, hist, records);
  return all_ok ? 0 : 1;
}

}  // namespace activekv::gpu_bench
