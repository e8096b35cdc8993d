// Device helpers of bench_prefill_attention (prefill_bench_kernels.cu).
#pragma once

#include <cstddef>
#include <cstdint>

typedef struct CUstream_st* cudaStream_t;

namespace activekv::bench_prefill {

/// n bf16 values uniform in [-amp, amp) (hash of index and seed).
void fill_bf16(void* p, size_t n, uint32_t seed, float amp, cudaStream_t st);
/// n fp32 values uniform in [-amp, amp).
void fill_f32(float* p, size_t n, uint32_t seed, float amp, cudaStream_t st);
/// Enqueues the mma.sync-only kernel (blocks x 256 threads); returns its FLOPs.
double launch_mma_peak(int blocks, int iters, float* sink, cudaStream_t st);

}  // namespace activekv::bench_prefill
