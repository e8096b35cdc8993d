// `activekv bench --device cuda` (bench_model.h): runtime::GpuRuntime, the
// runtime `generate --device cuda` runs, and the two bandwidths its floor is
// made of (bench/gpu/bandwidth.h, the same measurements as bench_matvec and
// calibrate).
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>

#include "activekv/core/error.h"
#include "activekv/cuda/decode_attention.h"
#include "activekv/model/tensor_split.h"
#include "activekv/model/tensors.h"
#include "activekv/runtime/gpu_runtime.h"
#include "activekv/runtime/tensor_parallel_runtime.h"
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
  std::string co_attention() const override { return rt_.stats().co_attention; }
  std::vector<float> last_logits() const override { return rt_.last_logits(); }

 private:
  runtime::GpuRuntime rt_;
  bool gpu_;
  std::string plan_;
  double cpu_share_;
};

// --gpus: the model tensor parallel (runtime::TensorParallelRuntime); the
// shards' bytes summed (each moves its heads' part of every page).
class TpSession final : public BenchSession {
 public:
  TpSession(const gguf::File& f, const model::ModelConfig& c, const runtime::RuntimeOptions& o,
            const std::vector<int>& gpus)
      : rt_(f, c, o, gpus) {}
  int64_t n_tokens() const override { return rt_.n_tokens(); }
  int32_t prefill(std::span<const int32_t> tokens) override { return rt_.prefill(tokens); }
  int32_t decode(int32_t token) override { return rt_.decode(token); }
  void wait_conversions() override { rt_.wait_conversions(); }
  double history_bytes() const override {
    return sum([&](const runtime::RuntimeStats& st) { return gpu() ? st.resident_bytes : st.streamed_bytes; });
  }
  double resident_history_bytes() const override {
    return placement() == "partial" ? sum([](const runtime::RuntimeStats& st) { return st.resident_bytes; }) : 0.0;
  }
  std::string placement() const override { return route::placement_name(rt_.stats(0).placement.placement); }
  std::string plan() const override {
    return fmt::format("{} shards, all-reduce by {}; shard 0: {}", rt_.n_shards(), rt_.uses_nccl() ? "NCCL" : "local sums",
                       rt_.stats(0).placement.reason);
  }
  std::vector<float> last_logits() const override { return rt_.last_logits(); }

 private:
  bool gpu() const { return rt_.stats(0).placement.placement == route::KvPlacement::gpu; }
  template <class F>
  double sum(F bytes) const {
    double b = 0;
    for (int i = 0; i < rt_.n_shards(); ++i) b += double(bytes(rt_.stats(i)));
    return b;
  }
  runtime::TensorParallelRuntime rt_;
};

// --gpus: the floor's figures per GPU. A step reads each GPU's shards'
// weights from its own HBM (the largest of them bounds the step) and
// streams the history over every distinct GPU's link at once.
void tensor_parallel_device(BenchDevice& d, const ModelBenchArgs& a, const gguf::File& f,
                            const model::ModelConfig& c) {
  const model::ModelTensors t = model::ModelTensors::find(f, c);
  const model::TensorSplitPlan plan = model::plan_tensor_split(c, t, int(a.gpus.size()));
  std::vector<int> distinct;
  std::vector<double> bytes, share;  // [distinct GPU] decode bytes its shards read; their part of the history
  for (size_t i = 0; i < a.gpus.size(); ++i) {
    const size_t k = size_t(std::find(distinct.begin(), distinct.end(), a.gpus[i]) - distinct.begin());
    if (k == distinct.size()) {
      distinct.push_back(a.gpus[i]);
      bytes.push_back(0);
      share.push_back(0);
    }
    bytes[k] += double(plan.decode_bytes(int(i)));
    share[k] += double(plan.shards[i].kv_heads.heads) / double(c.n_kv_heads);
  }
  d.gpus = a.gpus;
  d.hbm_devices = int(distinct.size());
  d.weight_bytes = *std::max_element(bytes.begin(), bytes.end());
  d.weight_form = fmt::format("as stored in the GGUF, the largest GPU's share of {} shards", a.gpus.size());
  d.h2d_gbps = 0;
  int prev = 0;
  cuda::check_cuda(cudaGetDevice(&prev), "cudaGetDevice");
  for (int g : distinct) {
    cuda::check_cuda(cudaSetDevice(g), fmt::format("bench --gpus: GPU {}", g).c_str());
    d.link_gbps.push_back(gpu_bench::measure_h2d_gbps(size_t(64) << 20, 16, 5));
    d.h2d_gbps += d.link_gbps.back();
  }
  cuda::check_cuda(cudaSetDevice(prev), "cudaSetDevice");
  // The slowest GPU bounds the step (the all-reduces join them every layer).
  // HBM: GPU 0's measured rate for every GPU (the same model of GPU).
  d.floor_ms = [bytes, share, links = d.link_gbps](const std::string& placement, double history, double resident,
                                                   double hbm) {
    double worst = 0;
    for (size_t g = 0; g < bytes.size(); ++g) {
      const double path = placement == "gpu" ? hbm : links[g];
      worst = std::max(worst, bytes[g] / (hbm * 1e6) + share[g] * history / (path * 1e6) +
                                  share[g] * resident / (hbm * 1e6));
    }
    return worst;
  };
  std::string list;
  for (int g : a.gpus) list += fmt::format("{}{}", list.empty() ? "" : ",", g);
  d.name = fmt::format("{} x {} (GPUs {}), tensor parallel", a.gpus.size(), d.name, list);
}

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
  int current = 0;  // the home GPU (run_model_bench's require_gpu made it current)
  if (cudaGetDevice(&current) != cudaSuccess || cudaGetDeviceProperties(&prop, current) != cudaSuccess)
    throw Error("--device cuda: no usable CUDA GPU");
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
  if (!a.gpus.empty()) {
    tensor_parallel_device(d, a, f, c);
    d.cuda_graphs = false;  // the tensor-parallel runtime runs kernel by kernel
    d.open = [&f, c, g, gpus = a.gpus](const std::string& format, const std::string& placement, int64_t n_ctx) {
      GenerateArgs o = g;
      o.kv_format = format;
      o.kv_placement = placement;
      runtime::RuntimeOptions ro = runtime_options(o, n_ctx);
      ro.cpu_share = 0;
      ro.cuda_graphs = false;
      return std::unique_ptr<BenchSession>(std::make_unique<TpSession>(f, c, ro, gpus));
    };
    return d;
  }
  d.open = [&f, c, g](const std::string& format, const std::string& placement, int64_t n_ctx) {
    GenerateArgs o = g;
    o.kv_format = format;
    o.kv_placement = placement;
    return std::unique_ptr<BenchSession>(std::make_unique<GpuSession>(f, c, runtime_options(o, n_ctx)));
  };
  return d;
}

}  // namespace activekv::cli
