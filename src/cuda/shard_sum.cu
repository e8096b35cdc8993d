// The local sum of shards' buffers. See shard_sum.h.
#include "shard_sum.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "cuda_check.h"

namespace activekv::cuda {
namespace {

struct ShardSources {
  const float* p[kMaxSumShards];
};

__global__ void sum_shards_kernel(float* out, ShardSources src, int n_src, size_t n) {
  for (size_t j = size_t(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += size_t(gridDim.x) * blockDim.x) {
    float acc = src.p[0][j];
    for (int i = 1; i < n_src; ++i) acc = __fadd_rn(acc, src.p[i][j]);
    out[j] = acc;
  }
}

}  // namespace

void launch_sum_shards(float* out, const float* const* src, int n_src, size_t n, cudaStream_t stream) {
  if (n_src < 1 || n_src > kMaxSumShards) throw InvalidArgument("launch_sum_shards: 1 to 8 sources");
  if (n == 0) return;
  ShardSources s{};
  for (int i = 0; i < n_src; ++i) s.p[i] = src[i];
  const int threads = 256;
  const int blocks = int(std::min<size_t>((n + threads - 1) / threads, 1024));
  sum_shards_kernel<<<blocks, threads, 0, stream>>>(out, s, n_src, n);
  AKV_CUDA(cudaGetLastError());
}

}  // namespace activekv::cuda
