// Device helpers of bench_prefill_attention: random fills and the mma.sync
// ceiling (a kernel that does nothing but m16n8k16 bf16 mma.sync).
#include <cuda_runtime.h>

#include <cstdint>

#include "mma_util.cuh"
#include "prefill_bench_kernels.h"

namespace activekv::bench_prefill {
namespace {

__device__ uint32_t hash32(uint64_t i, uint32_t seed) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + seed * 0xD1B54A32D192ED03ull + 1;
  x ^= x >> 31; x *= 0xBF58476D1CE4E5B9ull; x ^= x >> 29;
  return uint32_t(x >> 32);
}
// Uniform in [-amp, amp).
__device__ float uniform(uint64_t i, uint32_t seed, float amp) {
  return (float(hash32(i, seed) >> 8) * (1.f / 8388608.f) - 1.f) * amp;
}

__global__ void fill_bf16_kernel(uint16_t* p, size_t n, uint32_t seed, float amp) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float f = uniform(i, seed, amp);
    p[i] = uint16_t(__float_as_uint(f) >> 16);
  }
}
__global__ void fill_f32_kernel(float* p, size_t n, uint32_t seed, float amp) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = uniform(i, seed, amp);
}

// Each warp keeps kAcc independent accumulators (enough to cover the mma
// latency) and issues `iters` x kAcc mma.sync with register operands.
constexpr int kAcc = 8;
__global__ void __launch_bounds__(256) mma_peak_kernel(int iters, float* sink) {
  using namespace ::activekv::cuda::detail;
  uint32_t a[4] = {threadIdx.x, threadIdx.x * 3u, threadIdx.x * 5u, threadIdx.x * 7u};
  const uint32_t b0 = threadIdx.x * 11u, b1 = threadIdx.x * 13u;
  float d[kAcc][4] = {};
  for (int i = 0; i < iters; ++i)
#pragma unroll
    for (int j = 0; j < kAcc; ++j) mma_bf16_full(d[j], a, b0, b1);
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < kAcc; ++j) s += d[j][0] + d[j][1] + d[j][2] + d[j][3];
  if (s == 1.2345f) sink[threadIdx.x] = s;  // keeps the work; practically never true
}

}  // namespace

void fill_bf16(void* p, size_t n, uint32_t seed, float amp, cudaStream_t st) {
  fill_bf16_kernel<<<1024, 256, 0, st>>>(static_cast<uint16_t*>(p), n, seed, amp);
}
void fill_f32(float* p, size_t n, uint32_t seed, float amp, cudaStream_t st) {
  fill_f32_kernel<<<1024, 256, 0, st>>>(p, n, seed, amp);
}
double launch_mma_peak(int blocks, int iters, float* sink, cudaStream_t st) {
  mma_peak_kernel<<<blocks, 256, 0, st>>>(iters, sink);
  return double(blocks) * (256 / 32) * double(iters) * kAcc * (2.0 * 16 * 8 * 16);
}

}  // namespace activekv::bench_prefill
