// `activekv bench --device cuda` (bench_model.h): runtime::GpuRuntime, the
// runtime `generate --device cuda` runs, and the two bandwidths its floor is
// made of (bench/gpu/bandwidth.h, the same measurements as bench_matvec and
// calibrate).
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
      : rt_(f, c, o), host_(rt_.stats().placement.placement == route::KvPlacement::host) {}
  int64_t n_tokens() const override { return rt_.n_tokens(); }
  int32_t prefill(std::span<const int32_t> tokens) override { return rt_.prefill(tokens); }
  int32_t decode(int32_t token) override { return rt_.decode(token); }
  void wait_conversions() override { rt_.wait_conversions(); }
  double history_bytes() const override {
    return double(host_ ? rt_.stats().streamed_bytes : rt_.stats().resident_bytes);
  }
  std::vector<float> last_logits() const override { return rt_.last_logits(); }

 private:
  runtime::GpuRuntime rt_;
  bool host_;
};

}  // namespace

BenchDevice gpu_bench_device(const ModelBenchArgs& a, const gguf::File& f, const model::ModelConfig& c) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) throw Error("--device cuda: no usable CUDA GPU");
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) throw Error("--device cuda: cudaMemGetInfo failed");
  BenchDevice d;
  d.name = prop.name;
  d.weight_bytes = decode_weight_bytes(f, false);
  // 4 GiB (far past the L2) unless the GPU has less than 16 GiB free.
  d.weight_gbps = gpu_bench::measure_hbm_read_gbps(std::min(size_t(4) << 30, free / 4), 10);
  d.weight_link = "HBM read";
  d.cuda_graphs = a.cuda_graphs == "on";
  // 64 MiB copies: the size class of the engine's tile copies (SPEC §1: ~55 GB/s from 16 MiB up).
  d.h2d_gbps = gpu_bench::measure_h2d_gbps(size_t(64) << 20, 16, 5);
  GenerateArgs g;  // the runtime options `generate --device cuda` would build
  g.model = a.model;
  g.page_size = a.page_size;
  g.recent_pages = a.recent_pages;
  g.tile_pages = a.tile_pages;
  g.convert_threads = a.convert_threads;
  g.prefill_chunk = a.prefill_chunk;
  g.cuda_graphs = a.cuda_graphs;
  const double cpu_share = a.cpu_share;
  g.sampling.temperature = 0;  // greedy: no sampling cost beyond an argmax, and repeatable
  d.open = [&f, c, g, cpu_share](const std::string& format, const std::string& placement, int64_t n_ctx) {
    GenerateArgs o = g;
    o.kv_format = format;
    o.kv_placement = placement;
    o.cpu_share = placement == "host" ? cpu_share : 0;
    return std::unique_ptr<BenchSession>(std::make_unique<GpuSession>(f, c, runtime_options(o, n_ctx)));
  };
  return d;
}

}  // namespace activekv::cli
