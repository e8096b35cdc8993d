// Internal to the CUDA backend: the kernel launchers behind GpuSampler
// (activekv/cuda/sampling.h). No argument checks here (sampling.cpp does
// them); each launcher throws CudaError if a launch fails. Plain C++17.
#pragma once

#include <cstddef>
#include <cstdint>

typedef struct CUstream_st* cudaStream_t;

namespace activekv::cuda::kernels {

/// Partials the argmax of n logits needs (floats and ints each).
int argmax_partials(int n);
/// token = index of the largest of logits[0..n) (lowest index on ties).
void argmax(const float* logits, int n, float* part_val, int* part_idx, int32_t* token, cudaStream_t stream);

/// idx[i] = i for i < n.
void iota(int* idx, int n, cudaStream_t stream);
/// CUB scratch bytes of sort_desc for n items.
size_t sort_scratch_bytes(int n);
/// (keys, idx_out) = the (logits, idx_in) pairs sorted by logit descending,
/// stable (cub::DeviceRadixSort::SortPairsDescending).
void sort_desc(void* scratch, size_t scratch_bytes, const float* logits, float* keys, const int* idx_in, int* idx_out,
               int n, cudaStream_t stream);

/// Partial sums sample_sorted needs for k candidates (doubles).
int prob_partials(int k);
/// The sampler's steps 2-4 (model/sampler.h) over the first k sorted
/// candidates (keys, idx): writes the chosen id to *token. prob: k doubles of
/// scratch; part_sum: prob_partials(k) doubles.
void sample_sorted(const float* keys, const int* idx, int k, float temperature, float top_p, uint64_t seed,
                   uint64_t draw, double* prob, double* part_sum, int32_t* token, cudaStream_t stream);

}  // namespace activekv::cuda::kernels
