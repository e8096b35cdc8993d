// The CPU share's partials into their split slots by a kernel that reads
// them in place in mapped pinned memory. See cpu_share.h for why not a copy.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "cpu_partials.h"
#include "cuda_check.h"

namespace activekv::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocksPerRun = 128;  // enough PCIe reads in flight for a layer's ~1 MB

// blockIdx.y = run: rows [src_row, src_row + count) of the staging (O rows
// of row_floats floats, LSE rows of nq floats) to rows [dst_row, ...) of the
// partials. row_floats is a multiple of 4 (head_dim >= 64): float4 loads.
__global__ void __launch_bounds__(kThreads)
gather_partials(PartialRuns runs, const float* __restrict__ src_o, const float* __restrict__ src_lse,
                float* __restrict__ dst_o, float* __restrict__ dst_lse, int row_floats, int nq) {
  const PartialRun r = runs.run[blockIdx.y];
  const size_t n4 = size_t(r.read) * size_t(row_floats) / 4;
  const float4* s = reinterpret_cast<const float4*>(src_o + size_t(r.src_row) * size_t(row_floats));
  float4* d = reinterpret_cast<float4*>(dst_o + size_t(r.dst_row) * size_t(row_floats));
  const size_t stride = size_t(gridDim.x) * kThreads;
  for (size_t i = size_t(blockIdx.x) * kThreads + threadIdx.x; i < n4; i += stride) d[i] = s[i];
  const size_t nl = size_t(r.read) * size_t(nq), n_empty = size_t(r.count) * size_t(nq);
  for (size_t i = size_t(blockIdx.x) * kThreads + threadIdx.x; i < n_empty; i += stride)
    dst_lse[size_t(r.dst_row) * size_t(nq) + i] = i < nl ? src_lse[size_t(r.src_row) * size_t(nq) + i] : -INFINITY;
}

}  // namespace

void launch_gather_partials(const PartialRuns& runs, const float* src_o, const float* src_lse, Partials parts,
                            int row_floats, int nq, cudaStream_t stream) {
  if (runs.n <= 0) return;
  int32_t most = 0;
  for (int i = 0; i < runs.n; ++i) most = std::max(most, runs.run[i].read);
  const size_t n4 = size_t(most) * size_t(row_floats) / 4;
  const int blocks = int(std::min<size_t>((n4 + kThreads - 1) / kThreads, kMaxBlocksPerRun));
  gather_partials<<<dim3(unsigned(std::max(blocks, 1)), unsigned(runs.n)), kThreads, 0, stream>>>(
      runs, src_o, src_lse, parts.o, parts.lse, row_floats, nq);
  AKV_CUDA(cudaGetLastError());
}

}  // namespace activekv::cuda
