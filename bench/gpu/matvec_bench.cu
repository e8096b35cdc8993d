// Micro-benchmark of the decode matvec on GGUF-typed weights (quant_matvec.h)
// against the measured HBM floor: per type, shape (rows x cols) and batch size,
// the median time of one matvec, the GB/s of weight bytes it reads, and its
// ratio to the read bandwidth of a plain streaming-read kernel (the floor a
// weight-bound matvec can reach; a cudaMemcpy D2D, counting read + write, is
// printed beside it). Not a test: it asserts nothing.
//
//   bench_matvec [--types Q4_0,Q4_K,...] [--shapes 6144x5120,...] [--nvec 1,8]
//                [--groups 6144+1024+1024x5120,...] [--kernel tiled|chunked]
//                [--layout split|gguf] [--pdl off|on] [--batches 30] [--json out.json]
//
// The default shapes are the 27B-shape model's matrices (rows x cols): Q
// 6144x5120, K/V 1024x5120, O 5120x6144, gate/up 17408x5120, down 5120x17408,
// output 32000x5120. --kernel picks the block-type matvec kernel for
// matrices in the GGUF layout (set_block_matvec_kernel; not given, the
// runtime's: ACTIVEKV_MATVEC_KERNEL, else chunked, so an A/B of that variable
// reaches this program too); --layout split puts Q4_0, Q4_1, Q5_0, Q8_0,
// Q4_K and Q6_K matrices in the split layout, which only the register
// kernel reads, whatever --kernel says (quant_matvec.h's WeightLayout);
// other types stay GGUF. Not given, the runtime's (GpuWeights):
// ACTIVEKV_WEIGHT_LAYOUT=gguf|split, else split -- so an A/B of that
// variable (scripts/device_run.sh ab) reaches this program too.
//
// Timing: CUDA events around a batch of back-to-back launches on one stream
// (>= 20), rotating between enough copies of the matrix that their bytes are
// >= 4x the L2 (so L2 does not serve the weights); per-launch time = batch
// time / launches, median over batches after warm-up. `us` is the weight
// kernel alone (launch_matvec_prequantized: x quantised once, as when Q, K, V
// share it); `us_with_quantize` is launch_matvec (both kernels). Weights are
// random bytes (timing does not depend on the values).
//
// Groups (--groups, rows of the matrices joined by '+', x cols; default the
// 27B shape's QKV 6144+1024+1024x5120 and gate/up 17408+17408x5120, "" for
// none): matrices that read one x, timed as one grouped launch
// (launch_matvec_prequantized_group) and as one launch per matrix
// (launch_matvec_prequantized) in the same rotation; GB/s and % of HBM read
// count the bytes of all the group's matrices.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <string>
#include <vector>

#include "activekv/cuda/launch.h"
#include "activekv/cuda/quant_matvec.h"
#include "bandwidth.h"  // measure_hbm_read_gbps (bench/gpu)

namespace {

using activekv::cuda::check_cuda;
using activekv::gguf::TensorType;
using activekv::cuda::WeightLayout;

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

std::vector<std::string> split(const std::string& s, char sep = ',') {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

/// "R1+R2+...xC": the rows of each matrix and their common cols.
std::pair<std::vector<int64_t>, int64_t> parse_group(const std::string& g) {
  const size_t x = g.rfind('x');
  std::vector<int64_t> rows;
  int64_t cols = 0;
  try {
    if (x == std::string::npos) throw std::invalid_argument(g);
    for (const std::string& r : split(g.substr(0, x), '+')) rows.push_back(std::stoll(r));
    cols = std::stoll(g.substr(x + 1));
  } catch (const std::logic_error&) {
    rows.clear();
  }
  const bool ok = !rows.empty() && int(rows.size()) <= activekv::cuda::kMaxMatvecGroup && cols > 0 &&
                  std::all_of(rows.begin(), rows.end(), [](int64_t r) { return r > 0; });
  if (!ok) throw activekv::InvalidArgument("bad group '" + g + "' (expected R1+R2+...xCOLS, 1..4 matrices)");
  return {rows, cols};
}

/// The matrices of one group in `copies` rotating copies, each 256-byte aligned.
struct GroupCopies {
  std::vector<size_t> offset;  // of matrix i in a copy
  size_t copy_bytes = 0, weight_bytes = 0;
  int copies = 0;
};

/// The layout a matrix of `type` gets under --layout: split where the type has one.
WeightLayout layout_for(TensorType type, const std::string& layout) {
  return layout == "split" && activekv::cuda::has_split_layout(type) ? WeightLayout::Split : WeightLayout::Gguf;
}

GroupCopies layout_group(TensorType type, const std::vector<int64_t>& rows, int64_t cols, size_t l2) {
  GroupCopies g;
  const size_t rb = activekv::gguf::row_bytes(type, uint64_t(cols));
  for (int64_t r : rows) {
    g.offset.push_back(g.copy_bytes);
    g.weight_bytes += rb * size_t(r);
    g.copy_bytes += (rb * size_t(r) + 255) / 256 * 256;
  }
  g.copies = int(std::max<size_t>(2, (4 * l2 + g.copy_bytes - 1) / g.copy_bytes));
  return g;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Decode matvec on GGUF-typed weights vs the measured HBM read bandwidth"};
  std::string types = "Q4_0,Q4_K,Q6_K,Q8_0,Q4_1,Q5_K,F16,BF16,F32";
  std::string shapes = "6144x5120,1024x5120,5120x6144,17408x5120,5120x17408,32000x5120";
  std::string kernel;  // not given: the runtime's (ACTIVEKV_MATVEC_KERNEL, else chunked; quant_matvec.h)
  std::string nvecs = "1,2,8";
  std::string json_path;
  int batches = 30;
  app.add_option("--types", types, "weight types, comma-separated");
  app.add_option("--shapes", shapes, "rows x cols, comma-separated");
  app.add_option("--nvec", nvecs, "vectors per matvec (1..8), comma-separated");
  std::string groups = "6144+1024+1024x5120,17408+17408x5120";
  app.add_option("--groups", groups, "grouped launches: R1+R2+...xCOLS, comma-separated (\"\" for none)");
  app.add_option("--kernel", kernel, "block-type matvec kernel")->check(CLI::IsMember({"tiled", "chunked"}));
  std::string layout;
  app.add_option("--layout", layout, "weight layout of Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q6_K matrices")
      ->check(CLI::IsMember({"split", "gguf"}));
  std::string pdl = "off";
  app.add_option("--pdl", pdl,
                 "programmatic dependent launch between the timed launches (activekv/cuda/launch.h): off times "
                 "each kernel whole; on lets the next start loading its weights while one drains, as in a model step")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--batches", batches, "timed batches per row (median)")->check(CLI::Range(1, 10000));
  app.add_option("--json", json_path, "write the results as JSON here");
  CLI11_PARSE(app, argc, argv);
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);

  try {
    activekv::cuda::require_gpu(0, "bench_matvec");
    if (layout.empty()) layout = activekv::cuda::split_layout_wanted() ? "split" : "gguf";
    using activekv::cuda::BlockMatvecKernel;
    if (!kernel.empty())
      activekv::cuda::set_block_matvec_kernel(kernel == "chunked" ? BlockMatvecKernel::Chunked
                                                                  : BlockMatvecKernel::Tiled);
    kernel = activekv::cuda::block_matvec_kernel() == BlockMatvecKernel::Chunked ? "chunked" : "tiled";
    activekv::cuda::set_programmatic_launch(pdl == "on");
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
    std::printf("layout: %s (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K); programmatic dependent launch %s\n", layout.c_str(),
                pdl.c_str());
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
        const size_t stride = (bytes + 255) / 256 * 256;  // every copy 256-byte aligned, as cudaMalloc'd weights
        const int copies = int(std::max<size_t>(2, (4 * l2 + bytes - 1) / bytes));
        DevBuf w(stride * copies);
        fill_random<<<4096, 256>>>(static_cast<uint32_t*>(w.p), stride * copies / 4, 7);
        const WeightLayout wl = layout_for(type, layout);
        check_cuda(cudaGetLastError(), "fill_random");
        const int per_batch = copies * std::max(1, (20 + copies - 1) / copies);
        for (const std::string& ns : split(nvecs)) {
          const int nv = std::stoi(ns);
          DevBuf x(size_t(nv) * c * 4), y(size_t(nv) * r * 4), ws(activekv::cuda::matvec_workspace_bytes(c, nv));
          check_cuda(cudaMemset(x.p, 0, size_t(nv) * c * 4), "cudaMemset");  // finite x: time is value-independent
          auto mat = [&](int k) {
            return activekv::cuda::DeviceMatrix{type, static_cast<const char*>(w.p) + size_t(k) * stride, r, c, rb, wl};
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
    nlohmann::json group_rows = nlohmann::json::array();
    if (!split(groups).empty()) {
      std::printf("\n%-5s %22s %4s %10s %10s %9s %8s %12s %8s\n", "type", "group", "nvec", "MB", "us", "GB/s",
                  "of read", "us separate", "of read");
    }
    for (const std::string& ts : split(types)) {
      const TensorType type = parse_type(ts);
      for (const std::string& gs : split(groups)) {
        const auto parsed = parse_group(gs);
        const std::vector<int64_t>& g_rows = parsed.first;
        const int64_t c = parsed.second;
        const GroupCopies gl = layout_group(type, g_rows, c, l2);
        const size_t rb = activekv::gguf::row_bytes(type, uint64_t(c));
        DevBuf w(gl.copy_bytes * gl.copies);
        fill_random<<<4096, 256>>>(static_cast<uint32_t*>(w.p), gl.copy_bytes * gl.copies / 4, 7);
        check_cuda(cudaGetLastError(), "fill_random");
        const int per_batch = gl.copies * std::max(1, (20 + gl.copies - 1) / gl.copies);
        const int n = int(g_rows.size());
        int64_t max_rows = 0;
        for (int64_t r : g_rows) max_rows = std::max(max_rows, r);
        for (const std::string& ns : split(nvecs)) {
          const int nv = std::stoi(ns);
          DevBuf x(size_t(nv) * c * 4), ws(activekv::cuda::matvec_workspace_bytes(c, nv));
          std::vector<std::unique_ptr<DevBuf>> y;
          for (int i = 0; i < n; ++i) y.push_back(std::make_unique<DevBuf>(size_t(nv) * max_rows * 4));
          check_cuda(cudaMemset(x.p, 0, size_t(nv) * c * 4), "cudaMemset");
          // Copy k's matrices and their items (the outputs are shared by all copies).
          std::vector<activekv::cuda::DeviceMatrix> mats(size_t(gl.copies) * n);
          std::vector<activekv::cuda::MatvecGroupItem> items(mats.size());
          for (int k = 0; k < gl.copies; ++k) {
            for (int i = 0; i < n; ++i) {
              const size_t j = size_t(k) * n + i;
              mats[j] = {type, static_cast<const char*>(w.p) + size_t(k) * gl.copy_bytes + gl.offset[size_t(i)],
                         g_rows[size_t(i)], c, rb, layout_for(type, layout)};
              items[j] = {&mats[j], static_cast<float*>(y[size_t(i)]->p)};
            }
          }
          activekv::cuda::launch_quantize_activations(static_cast<float*>(x.p), c, nv, ws.p, nullptr);
          const double t_group = time_median(batches, [&] {
            for (int b = 0; b < per_batch; ++b) {
              activekv::cuda::launch_matvec_prequantized_group(&items[size_t(b % gl.copies) * n], n,
                                                               static_cast<float*>(x.p), nv, ws.p, nullptr);
            }
          }) / per_batch;
          const double t_sep = time_median(batches, [&] {
            for (int b = 0; b < per_batch; ++b) {
              for (int i = 0; i < n; ++i) {
                const auto& it = items[size_t(b % gl.copies) * n + i];
                activekv::cuda::launch_matvec_prequantized(*it.w, static_cast<float*>(x.p), nv, it.y, false, ws.p,
                                                           nullptr);
              }
            }
          }) / per_batch;
          check_cuda(cudaDeviceSynchronize(), "grouped matvec");
          const double gbs = double(gl.weight_bytes) / t_group * 1e-9, gbs_sep = double(gl.weight_bytes) / t_sep * 1e-9;
          std::printf("%-5s %22s %4d %10.1f %10.2f %9.0f %7.1f%% %12.2f %7.1f%%\n", ts.c_str(), gs.c_str(), nv,
                      gl.weight_bytes / 1e6, t_group * 1e6, gbs, 100 * gbs / read_gbs, t_sep * 1e6,
                      100 * gbs_sep / read_gbs);
          std::fflush(stdout);
          group_rows.push_back({{"type", ts}, {"group", gs}, {"matrix_rows", g_rows}, {"cols", c}, {"n_vec", nv},
                                {"weight_bytes", gl.weight_bytes}, {"copies", gl.copies}, {"us", t_group * 1e6},
                                {"gbs", gbs}, {"ratio_to_read", gbs / read_gbs}, {"ratio_to_copy", gbs / copy_gbs},
                                {"us_separate", t_sep * 1e6}, {"gbs_separate", gbs_sep},
                                {"ratio_to_read_separate", gbs_sep / read_gbs}});
        }
      }
    }
    if (!json_path.empty()) {
      const char* commit = std::getenv("AKV_COMMIT");  // the device run names the commit it built
      nlohmann::json out = {{"command", command},
                            {"commit", commit ? commit : "unknown"},
                            {"device", prop.name},
                            {"block_kernel", kernel},
                            {"layout", layout},
                            {"programmatic_launch", pdl == "on"},
                            {"sms", prop.multiProcessorCount},
                            {"l2_bytes", l2},
                            {"hbm_read_gbs", read_gbs},
                            {"hbm_read_method", "streaming read-only kernel, 4 GiB, 16-byte loads, median of 10"},
                            {"d2d_copy_gbs", copy_gbs},
                            {"d2d_copy_method", "cudaMemcpy D2D of 2 GiB, read + write bytes counted, median of 10"},
                            {"timing", "median over batches of >= 20 back-to-back launches rotating >= 4x L2 of "
                                       "weight copies; us = weight kernel (x prequantised)"},
                            {"rows", rows},
                            {"groups_timing", "us = one launch_matvec_prequantized_group over the group's matrices; "
                                              "us_separate = one launch_matvec_prequantized per matrix; same "
                                              "rotation; GB/s of all the group's weight bytes"},
                            {"groups", group_rows}};
      std::ofstream(json_path) << out.dump(2) << "\n";
      std::printf("\nwrote %s\n", json_path.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_matvec: %s\n", e.what());
    return 1;
  }
  return 0;
}
