// `activekv bench --device cpu` (bench_model.h): the CPU model path of
// `generate` (LlamaModel and its CPU weights, CpuHistory) and the host-memory read
// bandwidth its floor is made of.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "activekv/core/blas.h"
#include "activekv/model/llama_model.h"
#include "activekv/model/sampler.h"
#include "bench_model.h"
#include "cpu_session.h"
#include "generate.h"
#include "memory.h"
#include "stats.h"

namespace activekv::cli {
namespace {

/// Host-memory read bandwidth over a working set of `bytes`, first touched
/// by the `threads` OpenMP threads that then read it (each the part it
/// touched). The working set is what a decode step reads (its weights): a
/// model whose weights fit the CPU caches is floored by the caches'
/// bandwidth, one of gigabytes by DRAM's. Kept for the whole run, so that
/// the probes around each tg repetition (BenchDevice::probe_gbps) read the
/// same memory the up-front figure did.
class HostReadProbe {
 public:
  HostReadProbe(size_t bytes, int threads)
      : buf_(std::max<size_t>(bytes / sizeof(uint64_t), 1 << 17)), threads_(threads) {
    const size_t n = buf_.size();
    uint64_t* p = buf_.data();
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < n; ++i) p[i] = i * 0x9e3779b97f4a7c15ull;
  }
  size_t bytes() const { return buf_.size() * sizeof(uint64_t); }

  /// GB/s (1e9 B/s): a sum of 64-bit words, the whole set read as many
  /// times as make `bytes_per_timing` (at least once) per timing; the
  /// q-quantile of `reps` timings' milliseconds (0.5: the median; 0: the
  /// fastest) after one warm-up (which also brings a cache-sized set back
  /// into the caches the decode steps used).
  double gbps(size_t bytes_per_timing, int reps, double q) {
    const size_t n = buf_.size();
    const uint64_t* p = buf_.data();
    const int loops = int(std::max<size_t>(1, bytes_per_timing / bytes()));
    std::vector<double> ms;
    for (int r = 0; r <= reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      uint64_t acc = 0;
      for (int l = 0; l < loops; ++l) {
#pragma omp parallel for num_threads(threads_) schedule(static) reduction(+ : acc)
        for (size_t i = 0; i < n; ++i) acc += p[i];
      }
      if (r > 0) ms.push_back(ms_since(t0));
      sink_ = sink_ + acc;
    }
    return double(bytes()) * loops / (quantile(ms, q) * 1e6);
  }

 private:
  std::vector<uint64_t> buf_;
  int threads_;
  volatile uint64_t sink_ = 0;  // the sums go somewhere: the reads are not optimised away
};

// The figure of the run's header: ~1 GiB per timing, the median of 5 after a warm-up (~6 GiB read).
constexpr size_t kUpFrontBytes = size_t(1) << 30;
constexpr int kUpFrontReps = 5;
// A probe around a tg repetition: the fastest of 5 short timings (16 MiB:
// ~0.5-2 ms over a cache-sized set, as long as the tiny test model's timed
// steps; one pass over a 1 GiB set). The fastest, as STREAM reports: a
// floor is what the memory gives an undisturbed reader, and on a loaded
// machine a timing the scheduler interrupted says less about the memory
// than about the load (steps and probes are both interrupted at random;
// the median of long probes read 10 GB/s while the steps beside it ran at
// 15, measured on the 2-core dev machine).
constexpr size_t kProbeBytes = size_t(16) << 20;
constexpr int kProbeReps = 5;
constexpr double kProbeQuantile = 0;

// A greedy generate session (cpu_session.h) that counts what it reads.
class CpuBenchSession final : public BenchSession {
 public:
  CpuBenchSession(model::LlamaModel& lm, const CpuHistoryOptions& o, int64_t n_ctx) : s_(lm, o, n_ctx, greedy()) {
    s_.history().view().report = &report_;
  }
  int64_t n_tokens() const override { return s_.n_tokens(); }
  int32_t prefill(std::span<const int32_t> tokens) override {
    s_.prefill(tokens);
    return s_.sample();
  }
  int32_t decode(int32_t token) override {
    s_.step(token);
    return s_.sample();
  }
  void wait_conversions() override { s_.wait_conversions(); }
  // Counts what every forward call read (prefill included); the driver takes
  // differences around the timed decode steps.
  double history_bytes() const override { return report_.bytes; }
  std::vector<float> last_logits() const override { return {s_.logits().begin(), s_.logits().end()}; }

 private:
  static model::SamplerParams greedy() {
    model::SamplerParams p;
    p.temperature = 0;
    return p;
  }
  CpuSession s_;
  route::RouteReport report_;
};

}  // namespace

BenchDevice cpu_bench_device(const ModelBenchArgs& a, const gguf::File& f) {
  omp_set_num_threads(a.threads);
  set_blas_threads(a.threads);
  model::ForwardOptions fopt;
  fopt.prefill_chunk = a.prefill_chunk;
  fopt.attention.tile_pages = a.tile_pages;
  auto lm = std::make_shared<model::LlamaModel>(
      load_weights_checked(f, a.model, [&] { return model::LlamaModel(f, fopt); }));
  BenchDevice d;
  const std::string why_cpu = auto_cpu_reason(a.device, "cpu");
  d.name = fmt::format("cpu ({} threads, OpenBLAS {} kernels{})", a.threads, blas_core_name(),
                       why_cpu.empty() ? "" : "; " + why_cpu);
  d.weight_bytes = decode_weight_bytes(f, true);
  d.weight_form = model::weight_format_from_env() == model::WeightFormat::f32
                      ? "fp32, dequantised at load (ACTIVEKV_CPU_WEIGHTS=f32)"
                      : "Q4_0/Q4_1/Q8_0 matrices as stored, the rest fp32";
  // The weights' working set, at most 1 GiB (far past any cache: DRAM either way).
  auto probe = std::make_shared<HostReadProbe>(std::min(size_t(d.weight_bytes), size_t(1) << 30), a.threads);
  d.weight_gbps = probe->gbps(kUpFrontBytes, kUpFrontReps, 0.5);
  d.weight_link = "host read";
  d.probe_gbps = [probe] { return probe->gbps(kProbeBytes, kProbeReps, kProbeQuantile); };
  d.probe_note = fmt::format(
      "host read over the same {:.1f} MiB, probed right before and right after each tg repetition's timed steps "
      "(each probe the fastest of {} timings of >= {} MiB after a warm-up); a tg row's floor takes the mean of its "
      "probes", double(probe->bytes()) / double(1 << 20), kProbeReps, kProbeBytes >> 20);
  const CpuHistoryOptions base{"bf16", a.page_size, a.recent_pages, a.tile_pages, a.convert_threads};
  d.open = [lm, base](const std::string& format, const std::string&, int64_t n_ctx) {
    CpuHistoryOptions o = base;
    o.kv_format = format;
    return std::unique_ptr<BenchSession>(std::make_unique<CpuBenchSession>(*lm, o, n_ctx));
  };
  return d;
}

}  // namespace activekv::cli
