// Internal to the GPU bench and calibration: small host helpers shared by
// calibrate.cpp, decode_bench.cpp and bench_pages.cpp (statistics, synthetic
// data, device names).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "cuda_check.h"     // AKV_CUDA (src/cuda)
#include "device_buffer.h"  // DevBuf (src/cuda)

namespace activekv::gpu_bench {

using cuda::CudaError;
using cuda::DevBuf;

double median(std::vector<double> v);
/// Piecewise-linear interpolation of y(x) at `at` (x ascending; log x if `logx`);
/// clamps to the end values unless `extrapolate`.
double interp(const std::vector<double>& x, const std::vector<double>& y, double at, bool logx, bool extrapolate);

/// Name of CUDA device `dev` (cudaGetDeviceProperties).
std::string device_name(int dev);

/// n uniform values in [-1, 1) from `seed`, copied to device memory `d`.
void fill_device_random(float* d, size_t n, uint64_t seed);

/// Uniform random bf16 values in [-1, 1) from `seed` over `bytes` of host
/// memory, written with `threads` host threads (the same bytes for a given
/// seed whatever the thread count).
void fill_random_bf16(std::byte* data, size_t bytes, uint64_t seed, int threads);

/// Opens `path` for writing before the work, so that a bad path fails at
/// once; "" gives a closed stream (nothing to write). Throws Error
/// "<who>: cannot write <path>".
std::ofstream open_output(const std::string& path, const std::string& who);

/// Host threads to use: `requested` if positive, else the hardware's.
int host_threads(int requested = 0);

/// Runs fn(i) for every i in [0, n) on `threads` host threads (this one included).
template <class Fn>
void parallel_for(size_t n, int threads, Fn fn) {
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < n; i = next++) fn(i);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
}

}  // namespace activekv::gpu_bench
