// The two bandwidths every floor of this project is made of, measured the same
// way wherever they are used: the HBM read bandwidth (the weights' floor on a
// GPU: bench_matvec, `activekv bench`) and the back-to-back pinned host ->
// device copy bandwidth (the streamed history's floor: `activekv calibrate`,
// `activekv bench`). Units: GB/s = 1e9 bytes/s, milliseconds. Part of
// activekv_gpu_bench (bench/gpu); needs a CUDA GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace activekv::gpu_bench {

/// HBM read bandwidth of the current device: a streaming read-only kernel
/// (16-byte loads, 8 blocks of 512 threads per SM) over `bytes` of device
/// memory filled with random words (far past the L2, so the L2 serves none of
/// it), median of `reps` timed runs after 2 warm-ups (CUDA events). Allocates
/// `bytes` of device memory for the duration; throws CudaError if it cannot.
double measure_hbm_read_gbps(size_t bytes = size_t(4) << 30, int reps = 10);

/// Enqueues `n` back-to-back host -> device copies of `copy_bytes` each on
/// `s`, copy i from src + (i mod k) * copy_bytes to dst + the same offset
/// (`span`: bytes both buffers hold, >= copy_bytes; k = span / copy_bytes). `src` must be pinned for
/// the copies to be DMA at full speed. What `calibrate` times per copy size.
void enqueue_h2d_copies(std::byte* dst, const std::byte* src, size_t copy_bytes, int n, size_t span, cudaStream_t s);

/// Pinned host -> device bandwidth at one copy size: `n` back-to-back copies
/// of `copy_bytes` (enqueue_h2d_copies over pinned and device buffers of
/// copy_bytes * min(n, 4) bytes), median of `reps` timed batches after one
/// warm-up. Throws CudaError when the buffers cannot be had.
double measure_h2d_gbps(size_t copy_bytes = size_t(64) << 20, int n = 16, int reps = 5);

}  // namespace activekv::gpu_bench
