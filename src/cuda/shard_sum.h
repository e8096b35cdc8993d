// Internal to the CUDA backend: the local way of ShardAllReduce
// (activekv/cuda/shard_all_reduce.h), a sum of shards' buffers on one device.
#pragma once

#include <cstddef>

typedef struct CUstream_st* cudaStream_t;

namespace activekv::cuda {

/// Most buffers one launch_sum_shards adds.
inline constexpr int kMaxSumShards = 8;

/// out[j] = ((src[0][j] + src[1][j]) + src[2][j]) + ... for j < n: the
/// shards' order, one thread per element, so the bits depend on nothing
/// else. 1 <= n_src <= kMaxSumShards device pointers of this device; out may
/// be src[0]. Asynchronous on `stream`; throws CudaError if the launch fails.
void launch_sum_shards(float* out, const float* const* src, int n_src, size_t n, cudaStream_t stream);

}  // namespace activekv::cuda
