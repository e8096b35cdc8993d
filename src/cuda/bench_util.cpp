// Helpers of the GPU bench and calibration. See bench_util.h.
#include "bench_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace activekv::cuda::bench {

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

std::string jstr(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') { o += '\\'; o += c; }
    else if (c == '\n') o += "\\n";
    else if (static_cast<unsigned char>(c) < 0x20) o += ' ';
    else o += c;
  }
  return o + "\"";
}
std::string jnum(double v) {
  if (!std::isfinite(v)) return "null";
  char b[64];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
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


// int8s kernel curve (same token counts as the bf16 one) and the lossless13
// unpack time per page, on pages encoded from the random bf16 data by the CPU
// codecs. `dev_scratch` holds at least kernel_tokens.back() / page_size bf16 pages.

}  // namespace activekv::cuda::bench
