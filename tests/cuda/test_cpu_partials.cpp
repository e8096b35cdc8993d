// GPU test of the CPU share's partial gather (src/cuda/cpu_partials.h): the
// kernel that moves the CPU's partials from mapped pinned staging into the
// engine's split slots must copy every float of every run's rows read bit
// for bit, mark a run's other slots empty (LSE -inf: runs the CPU merged into
// their first row), and write nothing else. Its reference is the copy the
// host makes of the same runs. Labelled `gpu`.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <vector>

#include "../../src/cuda/cpu_partials.h"
#include "device_array.h"

namespace activekv::cuda {
namespace {

using testing::ck;
using testing::DeviceArray;

TEST(CpuPartialGather, CopiesEveryRunBitwiseAndNothingElse) {
  AKV_NEED_GPU();
  constexpr int nq = 24, hd = 256, row = nq * hd, stage_rows = 40, slots = 3 * 64;
  float* stage_o = nullptr;
  float* stage_lse = nullptr;
  ck(cudaHostAlloc(reinterpret_cast<void**>(&stage_o), size_t(stage_rows) * row * 4, cudaHostAllocMapped), "pin");
  ck(cudaHostAlloc(reinterpret_cast<void**>(&stage_lse), size_t(stage_rows) * nq * 4, cudaHostAllocMapped), "pin");
  for (size_t i = 0; i < size_t(stage_rows) * row; ++i) stage_o[i] = float(i % 9973) * 0.37f - 11.f;
  for (size_t i = 0; i < size_t(stage_rows) * nq; ++i) stage_lse[i] = float(i) * -0.5f;
  void* d_o = nullptr;
  void* d_lse = nullptr;
  ck(cudaHostGetDevicePointer(&d_o, stage_o, 0), "device pointer");
  ck(cudaHostGetDevicePointer(&d_lse, stage_lse, 0), "device pointer");
  // Three sequences of 64 split slots. 35 runs of 1-4 rows that never share a
  // slot (as the engine's: each split slot has one writer), the first slot of
  // sequence 0 and the last slots of sequence 2 among them: two launches.
  // Every other run merged (one row read), the rest read whole.
  std::vector<PartialRun> runs;
  int src = 0;
  for (int k = 0; k < 34; ++k) {
    const int count = 1 + k % 4;
    if (src + count > stage_rows) src = 0;
    runs.push_back({int64_t((k % 3) * 64 + (k / 3) * 5), int64_t(src), count, k % 2 ? 1 : count});
    src += count;
  }
  runs.push_back({3 * 64 - 4, 30, 4, 1});
  DeviceArray<float> part_o(size_t(slots) * row), part_lse(size_t(slots) * nq);
  part_o.poison();
  part_lse.poison();
  Partials parts{part_o.get(), part_lse.get(), 64};
  testing::Stream s;
  for (size_t i = 0; i < runs.size(); i += PartialRuns::kMax) {
    PartialRuns batch;
    for (size_t j = i; j < runs.size() && j < i + PartialRuns::kMax; ++j) batch.run[batch.n++] = runs[j];
    launch_gather_partials(batch, static_cast<const float*>(d_o), static_cast<const float*>(d_lse), parts, row, nq,
                           s.get());
    s.sync();
  }
  std::vector<float> want_o(size_t(slots) * row), want_lse(size_t(slots) * nq);
  std::memset(want_o.data(), 0xFF, want_o.size() * 4);
  std::memset(want_lse.data(), 0xFF, want_lse.size() * 4);
  for (const PartialRun& r : runs) {
    std::memcpy(&want_o[size_t(r.dst_row) * row], stage_o + size_t(r.src_row) * row, size_t(r.read) * row * 4);
    std::memcpy(&want_lse[size_t(r.dst_row) * nq], stage_lse + size_t(r.src_row) * nq, size_t(r.read) * nq * 4);
    for (size_t i = size_t(r.read) * nq; i < size_t(r.count) * nq; ++i)
      want_lse[size_t(r.dst_row) * nq + i] = -std::numeric_limits<float>::infinity();
  }
  const std::vector<float> got_o = part_o.download(), got_lse = part_lse.download();
  EXPECT_EQ(std::memcmp(got_o.data(), want_o.data(), want_o.size() * 4), 0) << "partial O differs from the runs' copy";
  EXPECT_EQ(std::memcmp(got_lse.data(), want_lse.data(), want_lse.size() * 4), 0) << "partial LSE differs";
  cudaFreeHost(stage_o);
  cudaFreeHost(stage_lse);
}

}  // namespace
}  // namespace activekv::cuda
