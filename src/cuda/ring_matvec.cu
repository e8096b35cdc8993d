// The ring matvec (ring_matvec.h).
//
// Why: at one vector and 5120 columns a lane's share of a row is 5 items,
// so a warp of the register kernel loads its row, waits one memory latency
// with nothing else of its own in flight, sums and exits; Nsight Compute saw
// 45-60 % of stalls on that wait and DRAM at 53-63 % (bench/results/
// h200_ncu_matvec_*). Holding the next rows in registers instead (a ring of
// register slots, e395370) lowered occupancy and lost. Here the bytes in
// flight sit in shared memory: each lane copies its own items into its own
// slots with cp.async, S - 1 chunks of kChunk items ahead of the one it
// sums, across row ends, and waits for its own copies only
// (cp.async.wait_group), so the warps never synchronise. A chunk, not an
// item, per step: one item a step (4bae7bd) spent ~130 instructions an item
// on the stream's bookkeeping and ran 1.3-2.2x slower than the register kernel.
//
// Same bits as the register kernel: lane l sums items l, l + 32, l + 64, ...
// of each row in that order with RegItems<T>'s dot on the same registers
// (RingItem<T>::read fills them as RegItems<T>::load does), and the row ends
// in the same write_row.
#include <cuda_runtime.h>

#include "activekv/core/error.h"
#include "matvec_host.h"
#include "matvec_kernel_util.cuh"
#include "once_per_device.h"
#include "pdl.cuh"
#include "quant_ring.cuh"
#include "ring_matvec.h"

namespace activekv::cuda::ringmv {
namespace {

using regmv::RegItems;
using regmv::RingItem;
using regmv::XAt;
using qdot::XQuant;

constexpr int kWarps = mvhost::kWarpsPerCta;

/// Items a lane copies and sums per step of its stream: a chunk of a row.
constexpr int kChunk = 4;

template <class T, int S>
__global__ void __launch_bounds__(kWarps * 32)
    ring_matvec_kernel(const uint8_t* __restrict__ w, int64_t rows, int n_blocks, XQuant xq, int64_t cols,
                       float* __restrict__ y, bool accumulate, int rows_per_warp) {
  using Items = RegItems<T>;
  using Ring = RingItem<T>;
  using Lane = typename Items::Lane;
  constexpr int kStageBytes = kChunk * Ring::kSlotBytes;
  static_assert((S & (S - 1)) == 0, "S is a power of two");
  extern __shared__ __align__(16) uint8_t ring_smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row0 = (int64_t(blockIdx.x) * kWarps + warp) * rows_per_warp;
  if (row0 >= rows) return;  // pdl.cuh: CTAs with no work may leave before pdl::begin
  const int n_rows = int(min(int64_t(rows_per_warp), rows - row0));
  const int n_items = n_blocks * qdot::Tiling<T>::kItemsPerBlock;
  // Chunks a row: its slots (items lane + 32k, k < the most items a lane has)
  // kChunk at a time: position p of the stream is chunk p % chunks of row p / chunks.
  const int chunks = ((n_items + 31) / 32 + kChunk - 1) / kChunk;
  const int total = n_rows * chunks;
  const int part = lane % qdot::Tiling<T>::kItemsPerBlock;
  const uint32_t stages = detail::smem_u32(ring_smem) + uint32_t(warp) * S * kStageBytes;
  // A place in the stream: chunk c of row r, `at` its first item's address.
  // Walked a chunk at a time: no division, a row's address once a row.
  struct Pos {
    int r, c;
    Lane at;
  };
  auto row_start = [&](int r) { return Items::lane_at(w, rows, 0, row0 + min(r, n_rows - 1), n_blocks, lane); };
  auto next = [&](Pos& q) {
    if (++q.c < chunks) {
      q.at = Items::advanced(q.at, kChunk);
    } else {
      q.c = 0;
      q.at = row_start(++q.r);
    }
  };
  Pos in{0, 0, row_start(0)};
  auto produce = [&](int p) {
    if (p < total) {
      const uint32_t stage = stages + (p & (S - 1)) * kStageBytes;
#pragma unroll
      for (int u = 0; u < kChunk; ++u)
        if (lane + 32 * (in.c * kChunk + u) < n_items) Ring::copy(Items::advanced(in.at, u), stage + u * Ring::kSlotBytes, lane);
      next(in);
    }
    detail::cp_async_commit();  // empty past the end: position p's copies are group p
  };
  // The weights do not depend on the kernels before (pdl.cuh): the first
  // S - 1 chunks travel while they drain.
#pragma unroll 1
  for (int p = 0; p < S - 1; ++p) produce(p);
  pdl::begin();

  const XAt x0 = Items::x_at(xq, lane);
  Pos out{0, 0, row_start(0)};
  float acc = 0.f;
#pragma unroll 1
  for (int p = 0; p < total; ++p) {
    produce(p + S - 1);
    const int k0 = out.c * kChunk;
    // The chunk's x first: its loads travel during the wait.
    const XAt xc = x0.at(k0);
    typename Items::template X<1> x[kChunk];
#pragma unroll
    for (int u = 0; u < kChunk; ++u)
      if (lane + 32 * (k0 + u) < n_items) Items::template load_x<1>(xc.at(u), cols, x[u]);
    detail::cp_async_wait<S - 1>();  // group p: this lane's copies of position p
    const uint32_t stage = stages + (p & (S - 1)) * kStageBytes;
#pragma unroll
    for (int u = 0; u < kChunk; ++u) {
      if (lane + 32 * (k0 + u) >= n_items) break;
      typename Items::Regs regs;
      Ring::read(stage + u * Ring::kSlotBytes, lane, Items::advanced(out.at, u), regs);
      Items::template dot<1>(regs, part, x[u], &acc);
    }
    const int r = out.r;
    next(out);
    if (out.c == 0) {  // row r done
      mvkern::write_row<1>(&acc, y, rows, row0 + r, accumulate);
      acc = 0.f;
    }
  }
  detail::cp_async_wait<0>();  // the empty groups past the end
}

template <class T, int S>
constexpr int smem_bytes() {
  return kWarps * S * kChunk * RingItem<T>::kSlotBytes;
}

/// CTAs of ring_matvec_kernel<T, S> that fit the device at once (its SMs x
/// the CTAs an SM holds), with the shared memory limit raised once per
/// device where it needs more than the default 48 KiB.
template <class T, int S>
int64_t resident_ctas() {
  static OncePerDevice smem_limit_set;
  constexpr int kSmem = smem_bytes<T, S>();
  smem_limit_set([] {
    check_cuda(cudaFuncSetAttribute(ring_matvec_kernel<T, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
               "ring matvec: shared memory limit");
  });
  int dev = 0, sms = 0, per_sm = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "ring matvec: SM count");
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, ring_matvec_kernel<T, S>, kWarps * 32, kSmem),
             "ring matvec: occupancy");
  if (per_sm < 1) throw CudaError("ring matvec: no CTA of " + std::to_string(kSmem) + " bytes of shared memory fits an SM");
  return int64_t(sms) * per_sm;
}

template <class T, int S>
void launch(const DeviceMatrix& w, const XQuant& xq, float* y, bool accumulate, cudaStream_t stream) {
  const int64_t fit = resident_ctas<T, S>();
  const int64_t cap = mvhost::ring_ctas();
  const mvhost::RingGrid g = mvhost::ring_grid(w.rows, cap > 0 ? std::min(cap, fit) : fit);
  pdl::launch("matvec (ring) kernel launch", ring_matvec_kernel<T, S>, unsigned(g.ctas), kWarps * 32,
              size_t(smem_bytes<T, S>()), stream, static_cast<const uint8_t*>(w.data), w.rows,
              int(w.cols / T::kElems), xq, w.cols, y, accumulate, g.rows_per_warp);
}

}  // namespace

bool run(const DeviceMatrix& w, const XQuant& xq, float* y, bool accumulate, cudaStream_t stream) {
  const int stages = mvhost::ring_stages();
  if (stages == 0 || w.layout != WeightLayout::Split || w.rows == 0) return false;
  bool done = false;
  qblk::dispatch_block_type(w.type, [&](auto traits) {
    using T = decltype(traits);
    if constexpr (RingItem<T>::kOk) {
      if (stages == 2) launch<T, 2>(w, xq, y, accumulate, stream);
      else if (stages == 4) launch<T, 4>(w, xq, y, accumulate, stream);
      else launch<T, 8>(w, xq, y, accumulate, stream);
      done = true;
    }
  });
  return done;
}

}  // namespace activekv::cuda::ringmv
