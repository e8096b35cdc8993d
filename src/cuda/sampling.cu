// Kernels of the GPU sampler (launchers: sampling_kernels.h; the class and
// the semantics: activekv/cuda/sampling.h, activekv/model/sampler.h).
//
// Everything is deterministic run to run: fixed reduction trees, no atomics.
// Where the CPU sums in double sequentially, the GPU sums in double in a tree;
// the results differ in the last bits only (see sampling.h for what that means
// for the tokens).
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>

#include "activekv/cuda/decode_attention.h"
#include "activekv/model/sample_rng.h"
#include "sampling_kernels.h"

namespace activekv::cuda::kernels {
namespace {

void check_launch(const char* what) { check_cuda(cudaGetLastError(), what); }

int ceil_div(int a, int b) { return (a + b - 1) / b; }

struct MinOp {
  __device__ int operator()(int a, int b) const { return a < b ? a : b; }
};

// ---- argmax -------------------------------------------------------------------

constexpr int kArgmaxThreads = 256;
constexpr int kArgmaxChunk = 4096;      // logits per block of the first pass
constexpr int kArgmaxMaxBlocks = kArgmaxThreads;  // the second pass is one block of kArgmaxThreads

struct Best {
  float v;
  int i;
};

// The larger value, the lower index on ties: associative and commutative for
// non-NaN values, so any tree gives the sequential scan's answer.
struct BetterOp {
  __device__ Best operator()(const Best& a, const Best& b) const {
    return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a;
  }
};

__device__ inline Best none() { return Best{-__int_as_float(0x7f800000), INT_MAX}; }  // -inf, no index

__global__ void argmax_partial_kernel(const float* logits, int n, int chunk, float* part_val, int* part_idx) {
  using Reduce = cub::BlockReduce<Best, kArgmaxThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const int begin = blockIdx.x * chunk, end = min(n, begin + chunk);
  Best b = none();
  for (int i = begin + threadIdx.x; i < end; i += kArgmaxThreads) b = BetterOp{}(b, Best{logits[i], i});
  b = Reduce(tmp).Reduce(b, BetterOp{});
  if (threadIdx.x == 0) {
    part_val[blockIdx.x] = b.v;
    part_idx[blockIdx.x] = b.i;
  }
}

__global__ void argmax_final_kernel(const float* part_val, const int* part_idx, int parts, int32_t* token) {
  using Reduce = cub::BlockReduce<Best, kArgmaxThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const int t = threadIdx.x;
  Best b = t < parts ? Best{part_val[t], part_idx[t]} : none();
  b = Reduce(tmp).Reduce(b, BetterOp{});
  if (t == 0) *token = b.i == INT_MAX ? 0 : b.i;  // all NaN: id 0, as the CPU's scan
}

__global__ void iota_kernel(int* idx, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) idx[i] = i;
}

// ---- probabilities: many blocks --------------------------------------------------

constexpr int kProbThreads = 256;
constexpr int kProbChunk = 4096;  // candidates per block

// prob[i] = exp((keys[i] - keys[0]) / temperature) in double, as the CPU; one
// partial sum per block.
__global__ void prob_kernel(const float* keys, int k, float temperature, double* prob, double* part_sum) {
  using Reduce = cub::BlockReduce<double, kProbThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const double top = keys[0], temp = temperature;
  const int begin = blockIdx.x * kProbChunk, end = min(k, begin + kProbChunk);
  double s = 0.0;
  for (int i = begin + threadIdx.x; i < end; i += kProbThreads) {
    const double p = exp((double(keys[i]) - top) / temp);
    prob[i] = p;
    s += p;
  }
  s = Reduce(tmp).Sum(s);
  if (threadIdx.x == 0) part_sum[blockIdx.x] = s;
}

// ---- nucleus and draw: one block ---------------------------------------------------

constexpr int kDrawThreads = 512;  // 1024 would cap registers at 64 and spill v[]
constexpr int kDrawItems = 8;  // consecutive candidates per thread and tile
constexpr int kTile = kDrawThreads * kDrawItems;

// Turns prob[0..k) into its running sum tile by tile (in place) until the
// running sum / sum reaches top_p (the nucleus: keep = that index + 1), then
// draws u * (running sum at keep - 1) and picks the first kept candidate whose
// running sum exceeds it. "First index such that" is a min-reduction, which
// does not need the tree's running sums to be monotone.
__global__ void __launch_bounds__(kDrawThreads) draw_kernel(const int* idx, int k, double* prob,
                                                             const double* part_sum, int parts, float top_p,
                                                             uint64_t seed, uint64_t draw, int32_t* token) {
  using Scan = cub::BlockScan<double, kDrawThreads>;
  using ReduceI = cub::BlockReduce<int, kDrawThreads>;
  __shared__ union {
    typename Scan::TempStorage scan;
    typename ReduceI::TempStorage reduce;
  } tmp;
  __shared__ double sum_s, carry_s;
  __shared__ int keep_s, hit_s;
  if (threadIdx.x == 0) {
    double s = 0.0;
    for (int b = 0; b < parts; ++b) s += part_sum[b];  // fixed order: repeatable
    sum_s = s;
    carry_s = 0.0;
    keep_s = k;
  }
  __syncthreads();
  const double sum = sum_s, target = double(top_p);

  for (int base = 0; base < k; base += kTile) {
    const int first = base + int(threadIdx.x) * kDrawItems;
    double v[kDrawItems];
    double mine = 0.0;
    for (int j = 0; j < kDrawItems; ++j) {
      v[j] = first + j < k ? prob[first + j] : 0.0;
      mine += v[j];
    }
    double before, tile_total;
    Scan(tmp.scan).ExclusiveSum(mine, before, tile_total);
    double run = carry_s + before;
    int hit = INT_MAX;
    for (int j = 0; j < kDrawItems && first + j < k; ++j) {
      run += v[j];
      prob[first + j] = run;
      if (hit == INT_MAX && run / sum >= target) hit = first + j;
    }
    __syncthreads();  // tmp changes role
    const int h = ReduceI(tmp.reduce).Reduce(hit, MinOp{});
    if (threadIdx.x == 0) {
      carry_s += tile_total;
      hit_s = h;
      if (h != INT_MAX) keep_s = h + 1;
    }
    __syncthreads();  // also publishes this tile's running sums to the block
    if (hit_s != INT_MAX) break;
  }

  const int keep = keep_s;
  const double u = activekv::model::sample_uniform(seed, draw) * prob[keep - 1];  // prob[keep-1]: the kept sum
  int pick = INT_MAX;
  for (int i = threadIdx.x; i < keep; i += kDrawThreads) {
    if (u < prob[i]) {
      pick = i;  // this thread's smallest such i
      break;
    }
  }
  __syncthreads();  // tmp was last used by the scan loop
  pick = ReduceI(tmp.reduce).Reduce(pick, MinOp{});
  if (threadIdx.x == 0) *token = idx[pick == INT_MAX ? keep - 1 : pick];
}

}  // namespace

int argmax_partials(int n) { return std::clamp(ceil_div(n, kArgmaxChunk), 1, kArgmaxMaxBlocks); }

void argmax(const float* logits, int n, float* part_val, int* part_idx, int32_t* token, cudaStream_t stream) {
  const int parts = argmax_partials(n);
  argmax_partial_kernel<<<parts, kArgmaxThreads, 0, stream>>>(logits, n, ceil_div(n, parts), part_val, part_idx);
  check_launch("argmax kernel launch");
  argmax_final_kernel<<<1, kArgmaxThreads, 0, stream>>>(part_val, part_idx, parts, token);
  check_launch("argmax final kernel launch");
}

void iota(int* idx, int n, cudaStream_t stream) {
  iota_kernel<<<std::min(ceil_div(n, 256), 1024), 256, 0, stream>>>(idx, n);
  check_launch("iota kernel launch");
}

size_t sort_scratch_bytes(int n) {
  size_t bytes = 0;
  check_cuda(cub::DeviceRadixSort::SortPairsDescending(nullptr, bytes, static_cast<const float*>(nullptr),
                                                       static_cast<float*>(nullptr), static_cast<const int*>(nullptr),
                                                       static_cast<int*>(nullptr), n),
             "cub::DeviceRadixSort::SortPairsDescending (scratch size)");
  return bytes;
}

void sort_desc(void* scratch, size_t scratch_bytes, const float* logits, float* keys, const int* idx_in, int* idx_out,
               int n, cudaStream_t stream) {
  check_cuda(cub::DeviceRadixSort::SortPairsDescending(scratch, scratch_bytes, logits, keys, idx_in, idx_out, n, 0,
                                                       32, stream),
             "cub::DeviceRadixSort::SortPairsDescending");
  check_launch("sort kernel launch");
}

int prob_partials(int k) { return ceil_div(k, kProbChunk); }

void sample_sorted(const float* keys, const int* idx, int k, float temperature, float top_p, uint64_t seed,
                   uint64_t draw, double* prob, double* part_sum, int32_t* token, cudaStream_t stream) {
  const int parts = prob_partials(k);
  prob_kernel<<<parts, kProbThreads, 0, stream>>>(keys, k, temperature, prob, part_sum);
  check_launch("sampler probability kernel launch");
  draw_kernel<<<1, kDrawThreads, 0, stream>>>(idx, k, prob, part_sum, parts, top_p, seed, draw, token);
  check_launch("sampler draw kernel launch");
}

}  // namespace activekv::cuda::kernels
