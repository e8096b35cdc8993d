// The ring matvec (ring_matvec.h).
//
// Why: at one vector and 5120 columns a lane's share of a row is 5 items,
// so a warp of the register kernel loads its row, waits one memory latency
// with nothing else of its own in flight, sums and exits; Nsight Compute saw
// 45-60 % of stalls on that wait and DRAM at 53-63 % (bench/results/
// h200_ncu_matvec_*). Holding the next rows in registers instead (a ring of
// register slots, e395370) lowered occupancy and lost. Here the bytes in
// flight sit in shared memory: each lane copies its own items into its own
// slots with cp.async, S - 1 items ahead of the one it sums, across row
// ends, and waits for its own copies only (cp.async.wait_group), so the
// warps never synchronise.
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

/// Where a lane is in its stream of items: row `row` of the warp's run, slot
/// k (item lane + 32k of the row), and that item's address.
template <class T>
struct Cursor {
  int row = 0, k = 0;
  typename RegItems<T>::Lane at;
};

template <class T, int S>
__global__ void __launch_bounds__(kWarps * 32)
    ring_matvec_kernel(const uint8_t* __restrict__ w, int64_t rows, int n_blocks, XQuant xq, int64_t cols,
                       float* __restrict__ y, bool accumulate, int rows_per_warp) {
  using Items = RegItems<T>;
  using Ring = RingItem<T>;
  static_assert((S & (S - 1)) == 0, "S is a power of two");
  extern __shared__ __align__(16) uint8_t ring_smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row0 = (int64_t(blockIdx.x) * kWarps + warp) * rows_per_warp;
  if (row0 >= rows) return;  // pdl.cuh: CTAs with no work may leave before pdl::begin
  const int n_rows = int(min(int64_t(rows_per_warp), rows - row0));
  const int n_items = n_blocks * qdot::Tiling<T>::kItemsPerBlock;
  const int per_row = (n_items + 31) / 32;  // slots a row: the most items a lane has in it
  const int total = n_rows * per_row;
  const int part = lane % qdot::Tiling<T>::kItemsPerBlock;
  const uint32_t slots = detail::smem_u32(ring_smem) + uint32_t(warp) * S * Ring::kSlotBytes;
  auto row_start = [&](int r) { return Items::lane_at(w, rows, 0, row0 + r, n_blocks, lane); };
  auto step = [&](Cursor<T>& c) {
    if (++c.k < per_row) {
      c.at = Items::advanced(c.at, 1);
    } else {
      c.k = 0;
      if (++c.row < n_rows) c.at = row_start(c.row);
    }
  };

  // Every position commits a group, empty past the end or where the lane
  // has no item, so that position p's copies are group p for every lane.
  Cursor<T> in{0, 0, row_start(0)};
  auto produce = [&](int p) {
    if (p < total && lane + 32 * in.k < n_items) Ring::copy(in.at, slots + (p & (S - 1)) * Ring::kSlotBytes, lane);
    detail::cp_async_commit();
    step(in);
  };
  // The weights do not depend on the kernels before (pdl.cuh): the first
  // S - 1 items travel while they drain.
#pragma unroll 1
  for (int p = 0; p < S - 1; ++p) produce(p);
  pdl::begin();

  Cursor<T> out{0, 0, row_start(0)};
  const XAt x0 = Items::x_at(xq, lane);
  XAt xk = x0;
  float acc = 0.f;
#pragma unroll 1
  for (int p = 0; p < total; ++p) {
    produce(p + S - 1);
    const bool has = lane + 32 * out.k < n_items;
    typename Items::template X<1> x;
    if (has) Items::template load_x<1>(xk, cols, x);
    detail::cp_async_wait<S - 1>();  // group p: this lane's copies of position p
    if (has) {
      typename Items::Regs regs;
      Ring::read(slots + (p & (S - 1)) * Ring::kSlotBytes, lane, out.at, regs);
      Items::template dot<1>(regs, part, x, &acc);
    }
    const int row = out.row;
    step(out);
    if (out.k == 0) {  // row done
      mvkern::write_row<1>(&acc, y, rows, row0 + row, accumulate);
      acc = 0.f;
      xk = x0;
    } else {
      xk = xk.at(1);
    }
  }
  detail::cp_async_wait<0>();  // the empty groups past the end
}

template <class T, int S>
constexpr int smem_bytes() {
  return kWarps * S * RingItem<T>::kSlotBytes;
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
      if (stages == 4) launch<T, 4>(w, xq, y, accumulate, stream);
      else if (stages == 8) launch<T, 8>(w, xq, y, accumulate, stream);
      else launch<T, 16>(w, xq, y, accumulate, stream);
      done = true;
    }
  });
  return done;
}

}  // namespace activekv::cuda::ringmv
