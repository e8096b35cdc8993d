// `activekv bench --device cpu` (bench_model.h): the CPU model path of
// `generate` (LlamaModel, fp32 weights, CpuHistory) and the host-memory read
// bandwidth its floor is made of.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "activekv/core/blas.h"
#include "activekv/model/llama_model.h"
#include "activekv/model/sampler.h"
#include "bench_model.h"
#include "cpu_session.h"
#include "memory.h"
#include "stats.h"

namespace activekv::cli {
namespace {

/// Host-memory read bandwidth (GB/s) with `threads` OpenMP threads over a
/// working set of `bytes`: a sum of 64-bit words, each thread reading the
/// part it first touched, repeated until a timing lasts >= ~20 ms, median of
/// `reps` after one warm-up. The working set is what a decode step reads (its
/// weights): a model whose weights fit the CPU caches is floored by the
/// caches' bandwidth, one of gigabytes by DRAM's.
double measure_host_read_gbps(size_t bytes, int threads, int reps) {
  const size_t n = std::max<size_t>(bytes / sizeof(uint64_t), 1 << 17);
  std::vector<uint64_t> buf(n);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (size_t i = 0; i < n; ++i) buf[i] = i * 0x9e3779b97f4a7c15ull;
  const int loops = int(std::max<size_t>(1, (size_t(1) << 30) / (n * sizeof(uint64_t))));  // ~1 GiB per timing
  std::vector<double> ms;
  volatile uint64_t sink = 0;
  for (int r = 0; r <= reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t acc = 0;
    for (int l = 0; l < loops; ++l) {
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : acc)
      for (size_t i = 0; i < n; ++i) acc += buf[i];
    }
    if (r > 0) ms.push_back(ms_since(t0));
    sink = sink + acc;
  }
  return double(n * sizeof(uint64_t)) * loops / (quantile(ms, 0.5) * 1e6);
}

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
  d.name = fmt::format("cpu ({} threads, OpenBLAS {} kernels)", a.threads, blas_core_name());
  d.weight_bytes = decode_weight_bytes(f, true);
  // The weights' working set, at most 1 GiB (far past any cache: DRAM either way).
  d.weight_gbps = measure_host_read_gbps(std::min(size_t(d.weight_bytes), size_t(1) << 30), a.threads, 5);
  d.weight_link = "host read";
  const CpuHistoryOptions base{"bf16", a.page_size, a.recent_pages, a.tile_pages, a.convert_threads};
  d.open = [lm, base](const std::string& format, const std::string&, int64_t n_ctx) {
    CpuHistoryOptions o = base;
    o.kv_format = format;
    return std::unique_ptr<BenchSession>(std::make_unique<CpuBenchSession>(*lm, o, n_ctx));
  };
  return d;
}

}  // namespace activekv::cli
