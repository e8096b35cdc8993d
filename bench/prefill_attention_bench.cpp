// bench_prefill_attention: speed of the flash-style chunked prefill attention
// (include/activekv/cuda/prefill.h) on one layer of an attention shape
// (default: the 27B target, 4 KV heads x 256 channels, 24 query heads, GQA 6,
// pages of 1024 tokens). A chunk of `rows` query rows sits at depth `pos0`
// (row r attends keys [0, pos0 + r]); for each term count it reports:
//   ms       per chunk and layer: CUDA events around each run, median of
//            --iters runs after --warmup runs
//   TFLOP/s  useful: 4 * n_q_heads * head_dim * (causal key count) / time
//   mma      the tensor-core rate this implies: useful x terms (each product
//            is issued once per bf16 term of Q and of P)
// against two ceilings measured in the same program: an mma.sync-only kernel
// (m16n8k16 bf16, fp32 accumulate: what this kernel's instructions can reach)
// and a dense cuBLAS bf16 GEMM (Hopper wgmma: the chip's bf16 rate, above
// mma.sync's). Also an estimate of the attention time of a whole prefill to
// the deepest depth, by linear interpolation between the measured depths
// (needs depth 0 in the list). Not a test: numbers only. --json writes them
// with the command line and the device.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "activekv/cuda/prefill.h"
#include "prefill_bench_kernels.h"

namespace {

using namespace activekv;
using namespace activekv::cuda;
using nlohmann::json;

struct Options {
  std::vector<std::string> rows = {"512", "2048"}, depths = {"0", "32k", "128k"};
  std::vector<int> terms = {kDefaultPrefillTerms};
  int n_kv = 4, group = 6, head_dim = 256, page_size = 1024, layers = 16;
  int iters = 10, warmup = 3, gemm_n = 8192;
  std::string json_path, commit;
};

int64_t parse_count(const std::string& s) {  // 512, 32k (= 32768)
  if (s.empty()) throw InvalidArgument("empty count");
  const bool k = s.back() == 'k' || s.back() == 'K';
  size_t used = 0;
  const long long v = std::stoll(k ? s.substr(0, s.size() - 1) : s, &used);
  if (used != s.size() - (k ? 1 : 0) || v < 0) throw InvalidArgument("bad count '" + s + "'");
  return k ? v * 1024 : v;
}

class Timer {
 public:
  explicit Timer(cudaStream_t st) : st_(st) {
    check_cuda(cudaEventCreate(&a_), "cudaEventCreate");
    check_cuda(cudaEventCreate(&b_), "cudaEventCreate");
  }
  ~Timer() {
    cudaEventDestroy(a_);
    cudaEventDestroy(b_);
  }
  // Median ms of `iters` timed calls of f after `warmup` untimed ones.
  template <class F>
  double median_ms(int warmup, int iters, F f) {
    for (int i = 0; i < warmup; ++i) f();
    std::vector<double> ms;
    for (int i = 0; i < iters; ++i) {
      check_cuda(cudaEventRecord(a_, st_), "cudaEventRecord");
      f();
      check_cuda(cudaEventRecord(b_, st_), "cudaEventRecord");
      check_cuda(cudaEventSynchronize(b_), "cudaEventSynchronize");
      float t = 0;
      check_cuda(cudaEventElapsedTime(&t, a_, b_), "cudaEventElapsedTime");
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }

 private:
  cudaStream_t st_;
  cudaEvent_t a_ = nullptr, b_ = nullptr;
};

void* dev_alloc(size_t bytes, const char* what) {
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, bytes), what);
  return p;
}

double mma_sync_peak_tflops(const cudaDeviceProp& prop, cudaStream_t st, Timer& tm) {
  float* sink = static_cast<float*>(dev_alloc(256 * sizeof(float), "cudaMalloc(sink)"));
  const int blocks = prop.multiProcessorCount * 8;  // 2048 threads per SM
  double flop = 0;
  const double ms = tm.median_ms(2, 5, [&] { flop = bench_prefill::launch_mma_peak(blocks, 4096, sink, st); });
  check_cuda(cudaGetLastError(), "mma_peak_kernel");
  cudaFree(sink);
  return flop / ms / 1e9;
}

double cublas_bf16_tflops(int n, cudaStream_t st, Timer& tm) {
  const size_t e = size_t(n) * n;
  void* a = dev_alloc(e * 2, "cudaMalloc(A)");
  void* b = dev_alloc(e * 2, "cudaMalloc(B)");
  void* c = dev_alloc(e * 2, "cudaMalloc(C)");
  bench_prefill::fill_bf16(a, e, 1, 1.f, st);
  bench_prefill::fill_bf16(b, e, 2, 1.f, st);
  cublasHandle_t h = nullptr;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) throw Error("cublasCreate failed");
  cublasSetStream(h, st);
  const float alpha = 1.f, beta = 0.f;
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  const double ms = tm.median_ms(3, 10, [&] {
    status = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n, &beta,
                          c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  });
  cublasDestroy(h);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  if (status != CUBLAS_STATUS_SUCCESS) throw Error("cublasGemmEx failed: status " + std::to_string(int(status)));
  return 2.0 * double(n) * n * n / ms / 1e9;
}

// Piecewise-linear ms at `depth` from measured (depth, ms) points sorted by depth.
double interp(const std::vector<std::pair<int64_t, double>>& pts, int64_t depth) {
  for (size_t i = 1; i < pts.size(); ++i)
    if (depth <= pts[i].first) {
      const double f = double(depth - pts[i - 1].first) / double(pts[i].first - pts[i - 1].first);
      return pts[i - 1].second + f * (pts[i].second - pts[i - 1].second);
    }
  return pts.back().second;
}

int run(const Options& opt, const std::string& command) {
  require_gpu(0, "bench_prefill_attention");
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::vector<int64_t> rows, depths;
  for (const std::string& s : opt.rows) rows.push_back(parse_count(s));
  for (const std::string& s : opt.depths) depths.push_back(parse_count(s));
  std::sort(depths.begin(), depths.end());
  for (int64_t r : rows)
    if (r <= 0 || r > (1 << 20)) throw InvalidArgument("--rows must be 1..2^20, got " + std::to_string(r));
  const AttnShape sh{opt.n_kv, opt.group, opt.head_dim, opt.page_size, opt.page_size, 0.f};
  sh.validate();
  cudaStream_t st = nullptr;
  check_cuda(cudaStreamCreate(&st), "cudaStreamCreate");
  Timer tm(st);

  const double mma_peak = mma_sync_peak_tflops(prop, st, tm);
  const double gemm = cublas_bf16_tflops(opt.gemm_n, st, tm);
  std::printf("%s, %d SMs: mma.sync bf16 ceiling %.1f TFLOP/s, cuBLAS bf16 GEMM %d^3 %.1f TFLOP/s\n", prop.name,
              prop.multiProcessorCount, mma_peak, opt.gemm_n, gemm);

  const int64_t max_rows = *std::max_element(rows.begin(), rows.end());
  const int64_t tokens = depths.back() + max_rows;
  const int64_t n_pages = (tokens + sh.page_size - 1) / sh.page_size;
  const int nq = sh.n_q_heads(), hd = sh.head_dim;
  std::byte* slab = static_cast<std::byte*>(dev_alloc(size_t(n_pages) * sh.page_bytes(), "cudaMalloc(pages)"));
  bench_prefill::fill_bf16(slab, size_t(n_pages) * sh.page_bytes() / 2, 3, 2.f, st);
  std::vector<const void*> table_h;
  for (int64_t i = 0; i < n_pages; ++i) table_h.push_back(slab + size_t(i) * sh.page_bytes());
  const void** table = static_cast<const void**>(dev_alloc(table_h.size() * sizeof(void*), "cudaMalloc(table)"));
  check_cuda(cudaMemcpy(table, table_h.data(), table_h.size() * sizeof(void*), cudaMemcpyHostToDevice),
             "cudaMemcpy(table)");
  float* q = static_cast<float*>(dev_alloc(size_t(max_rows) * nq * hd * 4, "cudaMalloc(q)"));
  float* out = static_cast<float*>(dev_alloc(size_t(max_rows) * nq * hd * 4, "cudaMalloc(out)"));
  float* lse = static_cast<float*>(dev_alloc(size_t(max_rows) * nq * 4, "cudaMalloc(lse)"));
  bench_prefill::fill_f32(q, size_t(max_rows) * nq * hd, 4, 1.f, st);
  check_cuda(cudaStreamSynchronize(st), "fill");

  json results = json::array(), estimates = json::array();
  std::printf("%6s %8s %5s %6s %6s %10s %9s %9s %8s %8s\n", "rows", "depth", "terms", "tiles", "splits", "ms",
              "TFLOP/s", "mma", "/mma", "/cuBLAS");
  for (int terms : opt.terms) {
    PrefillConfig cfg;
    cfg.terms = terms;
    PrefillAttention pf(sh, cfg);
    for (int64_t r : rows) {
      std::vector<std::pair<int64_t, double>> pts;
      for (int64_t d : depths) {
        const PrefillLaunch L = pf.plan(d, int(r));
        const double ms = tm.median_ms(opt.warmup, opt.iters,
                                       [&] { pf.run(table, n_pages, d, int(r), q, out, lse, st); });
        const double keys = double(r) * double(d) + double(r) * double(r + 1) / 2;  // causal (row, key) pairs
        const double tflops = 4.0 * nq * hd * keys / ms / 1e9;
        std::printf("%6lld %8lld %5d %6d %6d %10.3f %9.1f %9.1f %7.1f%% %7.1f%%\n", static_cast<long long>(r),
                    static_cast<long long>(d), terms, L.row_tiles, L.n_splits, ms, tflops, tflops * terms,
                    100 * tflops * terms / mma_peak, 100 * tflops / gemm);
        results.push_back({{"rows", r}, {"depth", d}, {"terms", terms}, {"row_tiles", L.row_tiles},
                           {"block_rows", L.block_rows}, {"n_splits", L.n_splits}, {"ms", ms},
                           {"tflops", tflops}, {"mma_tflops", tflops * terms},
                           {"ratio_mma_sync_peak", tflops * terms / mma_peak}, {"ratio_cublas", tflops / gemm}});
        pts.emplace_back(d, ms);
      }
      if (pts.front().first == 0 && pts.size() >= 2) {
        double total_ms = 0;
        int64_t chunks = 0;
        for (int64_t d = 0; d + r <= pts.back().first + r; d += r, ++chunks) total_ms += interp(pts, d);
        const double s = total_ms * opt.layers / 1e3;
        std::printf("  est. attention of a prefill to %lld tokens in chunks of %lld, %d layers, %d terms: %.1f s\n",
                    static_cast<long long>(pts.back().first + r), static_cast<long long>(r), opt.layers, terms, s);
        estimates.push_back({{"rows", r}, {"terms", terms}, {"tokens", pts.back().first + r}, {"chunks", chunks},
                             {"layers", opt.layers}, {"seconds", s}});
      }
    }
  }
  check_cuda(cudaGetLastError(), "bench");
  if (!opt.json_path.empty()) {
    json j = {{"bench", "prefill_attention"},
              {"command", command},
              {"commit", opt.commit},
              {"device", prop.name},
              {"sms", prop.multiProcessorCount},
              {"shape", {{"n_kv_heads", sh.n_kv_heads}, {"group", sh.group}, {"head_dim", sh.head_dim},
                         {"page_size", sh.page_size}}},
              {"timing", {{"iters", opt.iters}, {"warmup", opt.warmup}, {"statistic", "median of CUDA-event ms"}}},
              {"ceilings", {{"mma_sync_bf16_tflops", mma_peak}, {"cublas_bf16_gemm_tflops", gemm},
                            {"cublas_gemm_n", opt.gemm_n}}},
              {"results", results},
              {"estimates", estimates}};
    std::ofstream f(opt.json_path);
    if (!f) throw Error("cannot write " + opt.json_path);
    f << j.dump(2) << "\n";
    std::printf("JSON written to %s\n", opt.json_path.c_str());
  }
  cudaFree(slab);
  cudaFree(table);
  cudaFree(q);
  cudaFree(out);
  cudaFree(lse);
  cudaStreamDestroy(st);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"Prefill attention speed on the GPU (flash-style kernel over pages), one layer"};
  app.add_option("--rows", opt.rows, "Query rows per chunk (list; 2k = 2048)")->delimiter(',')->capture_default_str();
  app.add_option("--depths", opt.depths, "Tokens before the chunk (list; 32k = 32768)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--terms", opt.terms, "bf16 terms of Q and P (list of 1..3)")->delimiter(',')->capture_default_str();
  app.add_option("--n-kv-heads", opt.n_kv, "KV heads")->capture_default_str();
  app.add_option("--group", opt.group, "Query heads per KV head")->capture_default_str();
  app.add_option("--head-dim", opt.head_dim, "Head dimension (64, 128, 256)")->capture_default_str();
  app.add_option("--page-size", opt.page_size, "Tokens per page")->capture_default_str();
  app.add_option("--layers", opt.layers, "Layers, for the whole-prefill estimate")->capture_default_str();
  app.add_option("--iters", opt.iters, "Timed runs per point (median)")->capture_default_str()->check(CLI::Range(1, 1000));
  app.add_option("--warmup", opt.warmup, "Untimed runs first")->capture_default_str()->check(CLI::Range(0, 1000));
  app.add_option("--gemm-n", opt.gemm_n, "cuBLAS ceiling: n of the n^3 bf16 GEMM")->capture_default_str();
  app.add_option("--json", opt.json_path, "Write the results here");
  app.add_option("--commit", opt.commit, "Commit id recorded in the JSON");
  CLI11_PARSE(app, argc, argv);
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  try {
    return run(opt, command);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_prefill_attention: %s\n", e.what());
    return 1;
  }
}
