// Internal to the GPU bench and calibration: small host helpers shared by
// calibrate.cpp and bench.cpp (statistics, JSON text, device buffers).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "activekv/cuda/decode_attention.h"
#include "device_buffer.h"

namespace activekv::cuda::bench {

#define AKV_CUDA(call) ::activekv::cuda::check_cuda(static_cast<int>(call), #call)

double median(std::vector<double> v);
/// Piecewise-linear interpolation of y(x) at `at` (x ascending; log x if `logx`);
/// clamps to the end values unless `extrapolate`.
double interp(const std::vector<double>& x, const std::vector<double>& y, double at, bool logx, bool extrapolate);

/// JSON text pieces: a quoted string, a number (null when not finite), an array of numbers.
std::string jstr(const std::string& s);
std::string jnum(double v);
template <class T> std::string jarr(const std::vector<T>& v) {
  std::string o = "[";
  for (size_t i = 0; i < v.size(); ++i) o += (i ? ", " : "") + jnum(double(v[i]));
  return o + "]";
}

std::string device_name(int dev);

/// n uniform values in [-1, 1) from `seed`, copied to device memory `d`.
void fill_device_random(float* d, size_t n, uint64_t seed);

}  // namespace activekv::cuda::bench
