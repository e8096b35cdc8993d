// Helpers of the GPU bench and calibration. See bench_util.h.
#include "bench_util.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "activekv/core/error.h"

namespace activekv::gpu_bench {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

double interp(const std::vector<double>& x, const std::vector<double>& y, double at, bool logx, bool extrapolate) {
  if (x.empty()) return 0;
  if (x.size() == 1) return y[0];
  auto X = [&](double v) { return logx ? std::log(v) : v; };
  size_t i = 1;
  while (i + 1 < x.size() && at > x[i]) ++i;
  if (!extrapolate) {
    if (at <= x.front()) return y.front();
    if (at >= x.back()) return y.back();
  }
  const double t = (X(at) - X(x[i - 1])) / (X(x[i]) - X(x[i - 1]));
  return y[i - 1] + t * (y[i] - y[i - 1]);
}

std::string device_name(int dev) {
  cudaDeviceProp p{};
  AKV_CUDA(cudaGetDeviceProperties(&p, dev));
  return p.name;
}

void fill_device_random(float* d, size_t n, uint64_t seed) {
  std::vector<float> h(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 7;
  for (auto& v : h) {
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    v = float(double(x >> 11) / double(1ull << 53) * 2.0 - 1.0);
  }
  AKV_CUDA(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
}

void fill_random_bf16(std::byte* data, size_t bytes, uint64_t seed, int threads) {
  const size_t n = bytes / 2;
  constexpr size_t kChunk = size_t(1) << 22;  // values per chunk: seeding is per chunk
  const size_t n_chunks = (n + kChunk - 1) / kChunk;
  threads = std::max(1, threads);
  auto work = [&](int t) {
    for (size_t c = size_t(t); c < n_chunks; c += size_t(threads)) {
      uint64_t x = seed * 0x9E3779B97F4A7C15ull + c * 0xD1B54A32D192ED03ull + 1;
      uint16_t* p = reinterpret_cast<uint16_t*>(data) + c * kChunk;
      const size_t m = std::min(kChunk, n - c * kChunk);
      for (size_t i = 0; i < m; ++i) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        // uniform in [-1, 1): float with exponent 127 (1..2) minus 1.5, times 2
        const uint32_t bits = 0x3f800000u | uint32_t(x >> 41);
        float f;
        std::memcpy(&f, &bits, 4);
        f = (f - 1.5f) * 2.f;
        uint32_t fb;
        std::memcpy(&fb, &f, 4);
        p[i] = uint16_t(fb >> 16);
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
}

std::ofstream open_output(const std::string& path, const std::string& who) {
  std::ofstream f;
  if (path.empty()) return f;
  f.open(path);
  if (!f) throw Error(who + ": cannot write " + path);
  return f;
}

int host_threads(int requested) {
  return requested > 0 ? requested : int(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace activekv::gpu_bench
