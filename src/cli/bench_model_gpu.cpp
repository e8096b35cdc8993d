// `activekv bench --device cuda` (bench_model.h): runtime::GpuRuntime, the
// runtime `generate --device cuda` runs, and the two bandwidths its floor is
// made of (bench/gpu/bandwidth.h, the same measurements as bench_matvec and
// calibrate).
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>

#include "activekv/core/error.h"
#include "activekv/runtime/gpu_runtime.h"
#include "bandwidth.h"
#include "bench_model.h"
#include "generate.h"

namespace activekv::cli {
namespace {

class GpuSession final : public BenchSession {
 public:
  GpuSession(const gguf::File& f, const model::ModelConfig& c, const runtime::RuntimeOptions& o)
      : rt_(f, c, o), gpu_(rt_.stats().placement.placement == route::KvPlacement::gpu),
        plan_(placement_line(rt_.stats(), o.cpu_share)), cpu_share_(gpu_ ? 0.0 : o.cpu_share) {}
  int64_t n_tokens() const override { return rt_.n_tokens(); }
  int32_t prefill(std::span<const int32_t> tokens) override { return rt_.prefill(tokens); }
  int32_t decode(int32_t token) override { return rt_.decode(token); }
  double enqueue_seconds() const override { return rt_.stats().decode_enqueue_s; }
  void wait_conversions() override { rt_.wait_conversions(); }
  double history_bytes() const override {
    return double(gpu_ ? rt_.stats().resident_bytes : rt_.stats().streamed_bytes);
  }
  double resident_history_bytes() const override {
    return rt_.stats().placement.placement == route::KvPlacement::partial ? double(rt_.stats().resident_bytes) : 0.0;
  }
  std::string placement() const override { return route::placement_name(rt_.stats().placement.placement); }
  std::string plan() const override { return plan_; }
  double cpu_share() const override { return cpu_share_; }
  std::vector<float> last_logits() const override { return rt_.last_logits(); }

 private:
  runtime::GpuRuntime rt_;
  bool gpu_;
  std::string plan_;
  double cpu_share_;
};

}  // namespace

GenerateArgs bench_generate_args(const ModelBenchArgs& a) {
  GenerateArgs g;
  g.model = a.model;
  g.page_size = a.page_size;
  g.recent_pages = a.recent_pages;
  g.tile_pages = a.tile_pages;
  g.convert_threads = a.convert_threads;
  g.prefill_chunk = a.prefill_chunk;
  g.cuda_graphs = a.cuda_graphs;
  g.cpu_share = a.cpu_share;  // resolved per placement by runtime_options (resolve_cpu_share)
  g.gpu_kv_mem_gib = a.gpu_kv_mem_gib;
  g.sampling.temperature = 0;  // greedy: no sampling cost beyond an argmax, and repeatable
  return g;
}

BenchDevice gpu_bench_device(const ModelBenchArgs& a, const gguf::File& f, const model::ModelConfig& c) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) throw Error("--device cuda: no usable CUDA GPU");
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) throw Error("--device cuda: cudaMemGetInfo failed");
  BenchDevice d;
  d.name = prop.name;
  d.weight_bytes = decode_weight_bytes(f, false);
  d.weight_form = "as stored in the GGUF";
  // 4 GiB (far past the L2) unless the GPU has less than 16 GiB free.
  d.weight_gbps = gpu_bench::measure_hbm_read_gbps(std::min(size_t(4) << 30, free / 4), 10);
  d.weight_link = "HBM read";
  d.cuda_graphs = a.cuda_graphs != "off";
  // 64 MiB copies: the size class of the engine's tile copies (SPEC §1: ~55 GB/s from 16 MiB up).
  d.h2d_gbps = gpu_bench::measure_h2d_gbps(size_t(64) << 20, 16, 5);
  if (a.profile_timed)
    d.timed_range = [](bool on) {
      (void)cudaDeviceSynchronize();  // the range holds the timed steps' kernels, not earlier ones still queued
      (void)(on ? cudaProfilerStart() : cudaProfilerStop());
    };
  const GenerateArgs g = bench_generate_args(a);
  d.open = [&f, c, g](const std::string& format, const std::string& placement, int64_t n_ctx) {
    GenerateArgs o = g;
    o.kv_format = format;
    o.kv_placement = placement;
    return std::unique_ptr<BenchSession>(std::make_unique<GpuSession>(f, c, runtime_options(o, n_ctx)));
  };
  return d;
}

}  // namespace activekv::cli
