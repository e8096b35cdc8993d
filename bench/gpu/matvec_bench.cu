// Micro-benchmark of the decode matvec on GGUF-typed weights (quant_matvec.h)
// against the measured HBM floor: per type, shape (rows x cols) and batch size,
// the median time of one matvec, the GB/s of weight bytes it reads, and its
// ratio to the read bandwidth of a plain streaming-read kernel (the floor a
// weight-bound matvec can reach; a cudaMemcpy D2D, counting read + write, is
// printed beside it). Not a test: it asserts nothing.
//
//   bench_matvec [--types Q4_0,Q4_K,...] [--shapes 6144x5120,...] [--nvec 1,8]
//                [--kernel tiled|chunked] [--batches 30] [--json out.json]
//
// The default shapes are the 27B-shape model's matrices (rows x cols): Q
// 6144x5120, K/V 1024x5120, O 5120x6144, gate/up 17408x5120, down 5120x17408,
// output 32000x5120. --kernel picks the block-type matvec kernel
// (set_block_matvec_kernel; default chunked, the runtime's).
//
// Timing: CUDA events around a batch of back-to-back launches on one stream
// (>= 20), rotating between enough copies of the matrix that their bytes are
// >= 4x the L2 (so L2 does not serve the weights); per-launch time = batch
// time / launches, median over batches after warm-up. `us` is the weight
// kernel alone (launch_matvec_prequantized: x quantised once, as when Q, K, V
// share it); `us_with_quantize` is launch_matvec (both kernels). Weights are
// random bytes (timing does not depend on the values).
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "activekv/cuda/quant_matvec.h"
#include "bandwidth.h"  // measure_hbm_read_gbps (bench/gpu)

namespace {

using activekv::cuda::check_cuda;
using activekv::gguf::TensorType;

struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(size_t n) { check_cuda(cudaMalloc(&p, n), "cudaMalloc"); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
};

__global__ void fill_random(uint32_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 0x9e3779b9u ^ seed;
    h ^= h >> 16; h *= 0x85ebca6bu; h ^= h >> 13; h *= 0xc2b2ae35u; h ^= h >> 16;
    p[i] = h;
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Median seconds of fn() over `reps` timed runs after 2 warm-ups.
double time_median(int reps, const std::function<void()>& fn) {
  cudaEvent_t a, b;
  check_cuda(cudaEventCreate(&a), "cudaEventCreate");
  check_cuda(cudaEventCreate(&b), "cudaEventCreate");
  std::vector<double> t;
  for (int r = 0; r < reps + 2; ++r) {
    check_cuda(cudaEventRecord(a), "cudaEventRecord");
    fn();
    check_cuda(cudaEventRecord(b), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    if (r >= 2) t.push_back(ms * 1e-3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median(t);
}

TensorType parse_type(const std::string& s) {
  for (auto t : {TensorType::F32, TensorType::F16, TensorType::BF16, TensorType::Q8_0, TensorType::Q4_0,
                 TensorType::Q4_1, TensorType::Q5_0, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K}) {
    if (activekv::gguf::type_name(t) == s) return t;
  }
  throw activekv::InvalidArgument("unknown weight type '" + s + "'");
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Decode matvec on GGUF-typed weights vs the measured HBM read bandwidth"};
  std::string types = "Q4_0,Q4_K,Q6_K,Q8_0,Q4_1,Q5_K,F16,BF16,F32";
  std::string shapes = "6144x5120,1024x5120,5120x6144,17408x5120,5120x17408,32000x5120";
  std::string kernel = "chunked";  // the runtime's default (quant_matvec.h says why)
  std::string nvecs = "1,2,8";
  std::string json_path;
  int batches = 30;
  app.add_option("--types", types, "weight types, comma-separated");
  app.add_option("--shapes", shapes, "rows x cols, comma-separated");
  app.add_option("--nvec", nvecs, "vectors per matvec (1..8), comma-separated");
  app.add_option("--kernel", kernel, "block-type matvec kernel")->check(CLI::IsMember({"tiled", "chunked"}));
  app.add_option("--batches", batches, "timed batches per row (median)")->check(CLI::Range(1, 10000));
  app.add_option("--json", json_path, "write the results as JSON here");
  CLI11_PARSE(app, argc, argv);
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);

  try {
    activekv::cuda::require_gpu(0, "bench_matvec");
    using activekv::cuda::BlockMatvecKernel;
    activekv::cuda::set_block_matvec_kernel(kernel == "chunked" ? BlockMatvecKernel::Chunked
                                                                : BlockMatvecKernel::Tiled);
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    const size_t l2 = size_t(prop.l2CacheSize);

    // HBM floors on a 4 GiB buffer (far past L2).
    const size_t big = size_t(4) << 30;
    const double read_gbs = activekv::gpu_bench::measure_hbm_read_gbps(big, 10);
    DevBuf hbm(big);
    fill_random<<<4096, 256>>>(static_cast<uint32_t*>(hbm.p), big / 4, 1);
    check_cuda(cudaGetLastError(), "fill_random");
    const double t_copy = time_median(10, [&] {
      check_cuda(cudaMemcpyAsync(static_cast<char*>(hbm.p) + big / 2, hbm.p, big / 2, cudaMemcpyDeviceToDevice),
                 "cudaMemcpyAsync");
    });
    const double copy_gbs = double(big) / t_copy * 1e-9;
    std::printf("block-type kernel: %s\ndevice %s, %d SMs, L2 %.0f MB\nHBM floor: read-only kernel %.0f GB/s; cudaMemcpy D2D %.0f GB/s "
                "(read + write)\n\n",
                kernel.c_str(), prop.name, prop.multiProcessorCount, l2 / 1e6, read_gbs, copy_gbs);
    std::printf("%-5s %13s %4s %10s %10s %9s %8s %12s\n", "type", "rows x cols", "nvec", "MB", "us", "GB/s",
                "of read", "us +quant");

    nlohmann::json rows = nlohmann::json::array();
    for (const std::string& ts : split(types)) {
      const TensorType type = parse_type(ts);
      for (const std::string& ss : split(shapes)) {
        int64_t r = 0, c = 0;
        if (std::sscanf(ss.c_str(), "%ldx%ld", &r, &c) != 2 || r <= 0 || c <= 0) {
          throw activekv::InvalidArgument("bad shape '" + ss + "' (expected ROWSxCOLS)");
        }
        const size_t rb = activekv::gguf::row_bytes(type, uint64_t(c)), bytes = rb * size_t(r);
        const int copies = int(std::max<size_t>(2, (4 * l2 + bytes - 1) / bytes));
        DevBuf w(bytes * copies);
        fill_random<<<4096, 256>>>(static_cast<uint32_t*>(w.p), bytes * copies / 4, 7);
        check_cuda(cudaGetLastError(), "fill_random");
        const int per_batch = copies * std::max(1, (20 + copies - 1) / copies);
        for (const std::string& ns : split(nvecs)) {
          const int nv = std::stoi(ns);
          DevBuf x(size_t(nv) * c * 4), y(size_t(nv) * r * 4), ws(activekv::cuda::matvec_workspace_bytes(c, nv));
          check_cuda(cudaMemset(x.p, 0, size_t(nv) * c * 4), "cudaMemset");  // finite x: time is value-independent
          auto mat = [&](int k) {
            return activekv::cuda::DeviceMatrix{type, static_cast<const char*>(w.p) + size_t(k) * bytes, r, c, rb};
          };
          activekv::cuda::launch_quantize_activations(static_cast<float*>(x.p), c, nv, ws.p, nullptr);
          const double t_kernel = time_median(batches, [&] {
            for (int i = 0; i < per_batch; ++i) {
              activekv::cuda::launch_matvec_prequantized(mat(i % copies), static_cast<float*>(x.p), nv,
                                                         static_cast<float*>(y.p), false, ws.p, nullptr);
            }
          }) / per_batch;
          const double t_full = time_median(batches, [&] {
            for (int i = 0; i < per_batch; ++i) {
              activekv::cuda::launch_matvec(mat(i % copies), static_cast<float*>(x.p), nv, static_cast<float*>(y.p),
                                            false, ws.p, nullptr);
            }
          }) / per_batch;
          check_cuda(cudaDeviceSynchronize(), "matvec");
          const double gbs = double(bytes) / t_kernel * 1e-9;
          std::printf("%-5s %6ldx%-6ld %4d %10.1f %10.2f %9.0f %7.1f%% %12.2f\n", ts.c_str(), r, c, nv, bytes / 1e6,
                      t_kernel * 1e6, gbs, 100 * gbs / read_gbs, t_full * 1e6);
          std::fflush(stdout);
          rows.push_back({{"type", ts}, {"rows", r}, {"cols", c}, {"n_vec", nv}, {"weight_bytes", bytes},
                          {"copies", copies}, {"us", t_kernel * 1e6}, {"us_with_quantize", t_full * 1e6},
                          {"gbs", gbs}, {"ratio_to_read", gbs / read_gbs}, {"ratio_to_copy", gbs / copy_gbs}});
        }
      }
    }
    if (!json_path.empty()) {
      const char* commit = std::getenv("AKV_COMMIT");  // the device run names the commit it built
      nlohmann::json out = {{"command", command},
                            {"commit", commit ? commit : "unknown"},
                            {"device", prop.name},
                            {"block_kernel", kernel},
                            {"sms", prop.multiProcessorCount},
                            {"l2_bytes", l2},
                            {"hbm_read_gbs", read_gbs},
                            {"hbm_read_method", "streaming read-only kernel, 4 GiB, 16-byte loads, median of 10"},
                            {"d2d_copy_gbs", copy_gbs},
                            {"d2d_copy_method", "cudaMemcpy D2D of 2 GiB, read + write bytes counted, median of 10"},
                            {"timing", "median over batches of >= 20 back-to-back launches rotating >= 4x L2 of "
                                       "weight copies; us = weight kernel (x prequantised)"},
                            {"rows", rows}};
      std::ofstream(json_path) << out.dump(2) << "\n";
      std::printf("\nwrote %s\n", json_path.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_matvec: %s\n", e.what());
    return 1;
  }
  return 0;
}
