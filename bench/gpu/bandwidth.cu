// See bandwidth.h.
#include "bandwidth.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "activekv/cuda/pinned_memory.h"
#include "bench_util.h"

namespace activekv::gpu_bench {
namespace {

__global__ void fill_words(uint32_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 0x9e3779b9u ^ seed;
    h ^= h >> 16; h *= 0x85ebca6bu; h ^= h >> 13; h *= 0xc2b2ae35u; h ^= h >> 16;
    p[i] = h;
  }
}

/// Streams n 16-byte words once; the sum is written only if it hits a magic
/// value (never), so the loads cannot be optimised away.
__global__ void read_only(const uint4* __restrict__ p, size_t n, uint32_t* out) {
  uint32_t acc = 0;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = p[i], b = p[i + stride], c = p[i + 2 * stride], d = p[i + 3 * stride];
    acc += a.x ^ b.y ^ c.z ^ d.w ^ a.w ^ b.x ^ c.y ^ d.z;
  }
  for (; i < n; i += stride) acc += p[i].x ^ p[i].w;
  if (acc == 0x9e3779b9u) out[0] = acc;
}

// Median milliseconds of body() on stream s over `reps` runs after `warmup`.
template <class Body>
double median_ms(cudaStream_t s, int warmup, int reps, Body&& body) {
  cudaEvent_t a = nullptr, b = nullptr;
  AKV_CUDA(cudaEventCreate(&a));
  AKV_CUDA(cudaEventCreate(&b));
  std::vector<double> t;
  for (int r = 0; r < warmup + reps; ++r) {
    AKV_CUDA(cudaEventRecord(a, s));
    body();
    AKV_CUDA(cudaEventRecord(b, s));
    AKV_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    AKV_CUDA(cudaEventElapsedTime(&ms, a, b));
    if (r >= warmup) t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median(t);
}

}  // namespace

double measure_hbm_read_gbps(size_t bytes, int reps) {
  int dev = 0, sms = 0;
  AKV_CUDA(cudaGetDevice(&dev));
  AKV_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  bytes = bytes / 16 * 16;
  DevBuf buf(bytes, "HBM read bandwidth: buffer"), sink(64, "HBM read bandwidth: sink");
  fill_words<<<4096, 256>>>(buf.as<uint32_t>(), bytes / 4, 1);
  AKV_CUDA(cudaGetLastError());
  AKV_CUDA(cudaDeviceSynchronize());
  const double ms = median_ms(nullptr, 2, reps, [&] {
    read_only<<<sms * 8, 512>>>(buf.as<const uint4>(), bytes / 16, sink.as<uint32_t>());
  });
  AKV_CUDA(cudaGetLastError());
  return double(bytes) / (ms * 1e6);
}

void enqueue_h2d_copies(std::byte* dst, const std::byte* src, size_t copy_bytes, int n, size_t span, cudaStream_t s) {
  for (int i = 0; i < n; ++i) {
    const size_t off = size_t(i) % (span / copy_bytes) * copy_bytes;
    AKV_CUDA(cudaMemcpyAsync(dst + off, src + off, copy_bytes, cudaMemcpyHostToDevice, s));
  }
}

double measure_h2d_gbps(size_t copy_bytes, int n, int reps) {
  const size_t span = copy_bytes * size_t(std::min(n, 4));
  // The pinned source and the stream, released however the measurement ends.
  struct Resources {
    size_t span;
    std::byte* host = nullptr;
    cudaStream_t stream = nullptr;
    ~Resources() {
      if (stream) cudaStreamDestroy(stream);
      if (host) cuda::pinned_host_memory().free(host, span);
    }
  } r{span};
  r.host = cuda::pinned_host_memory().allocate(span);
  fill_random_bf16(r.host, span, 1, host_threads());
  DevBuf dst(span, "H2D bandwidth: copy target");
  AKV_CUDA(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
  const double ms =
      median_ms(r.stream, 1, reps, [&] { enqueue_h2d_copies(dst.as<std::byte>(), r.host, copy_bytes, n, span, r.stream); });
  return double(copy_bytes) * n / (ms * 1e6);
}

}  // namespace activekv::gpu_bench
