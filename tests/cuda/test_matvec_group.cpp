// The grouped matvec (launch_matvec_prequantized_group, quant_matvec.h) on the
// GPU: every type, both block-type kernels (and for split matrices the
// tensor-core kernel for several vectors), n_vec 1..8, the 27B-shape QKV and
// gate/up groups and small odd ones (an empty matrix, odd row counts, a
// group whose total rows change the chunked kernel's rows per warp): each
// output bitwise the separate launch's, small groups also bitwise the CPU
// emulation of the kernel, nothing written outside the outputs. Labelled
// `gpu`; its host half (checks, grid layout, which rows-per-warp rule holds)
// is test_matvec_group_host.cpp.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "matvec_test_util.h"
#include "mma_matvec.h"

namespace activekv::cuda {
namespace {

using namespace wtest;

#define NEED_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device"

struct GroupCase {
  const char* what;
  std::vector<int64_t> rows;
  int64_t cols;
  bool emulate;  // also against the CPU emulation (small enough to replay on the CPU)
};

const std::vector<GroupCase>& cases() {
  static const std::vector<GroupCase> c = {
      {"27B QKV", {6144, 1024, 1024}, 5120, false},
      {"27B gate/up", {17408, 17408}, 5120, false},
      // Odd rows: R = 2 warps ending on one row, CTAs ending on fewer than 4 warps.
      {"odd", {37, 1, 130}, 768, true},
      // 4104 rows in all: the group takes R = 2 for 4-bit types at n_vec 1
      // where the 5-row matrix alone takes 1; an empty matrix in the middle.
      {"rows-per-warp", {4099, 0, 5}, 256, true},
      {"four", {3, 64, 1, 17}, 512, true},
  };
  return c;
}

/// The tensor-core kernel for 2..8 vectors on or off (mma_matvec.cu):
/// split matrices run the group both ways. On, its grid is capped at 3
/// CTAs, so that a CTA walks tiles of several matrices of the group.
struct MmaScope {
  mvhost::MmaMatvec before = mvhost::mma_matvec();
  explicit MmaScope(bool on) {
    mvhost::set_mma_matvec(on ? mvhost::MmaMatvec::On : mvhost::MmaMatvec::Off);
    mmamv::set_grid_cap(on ? 3 : 0);
  }
  ~MmaScope() {
    mvhost::set_mma_matvec(before);
    mmamv::set_grid_cap(0);
  }
};

/// Floats of guard between outputs: the kernel must not write them.
constexpr size_t kGuard = 64;

class MatvecGroup : public ::testing::TestWithParam<TensorType> {};

TEST_P(MatvecGroup, BitwiseTheSeparateLaunches) {
  NEED_GPU();
  const TensorType t = GetParam();
  uint64_t seed = 7000 + 100 * uint64_t(t);
  for (const WeightLayout layout : layouts_for(t))
  for (const GroupCase& gc : cases()) {
    const int n = int(gc.rows.size());
    std::vector<HostMatrix> h;
    std::vector<std::unique_ptr<DeviceCopy>> dw;
    for (int64_t r : gc.rows) {
      h.push_back(random_matrix(t, r, gc.cols, seed++));
      dw.push_back(std::make_unique<DeviceCopy>(h.back(), layout));
    }
    for (const BlockMatvecKernel kernel : kernels_for(t))
    for (const bool mma : layout == WeightLayout::Split ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
      const KernelScope scope(kernel);
      const MmaScope mma_scope(mma);
      for (int n_vec = 1; n_vec <= kMaxMatvecVectors; ++n_vec) {
        SCOPED_TRACE(std::string(gc.what) + " " + gguf::type_name(t) + " " + kernel_name(kernel) + " " +
                     layout_name(layout) + (mma ? " mma" : "") + " n_vec " + std::to_string(n_vec));
        const std::vector<float> x = random_x(n_vec, gc.cols, seed++);
        DevMem dx(x.size() * 4), ws(matvec_workspace_bytes(gc.cols, n_vec));
        upload(dx, x);
        ws.poison();
        launch_quantize_activations(dx.as<float>(), gc.cols, n_vec, ws.p, nullptr);
        // The group's outputs in one buffer, kGuard poisoned floats before each and after the last.
        std::vector<size_t> off;
        size_t total = kGuard;
        for (int64_t r : gc.rows) {
          off.push_back(total);
          total += size_t(n_vec) * size_t(r) + kGuard;
        }
        DevMem dy(total * 4);
        dy.poison();
        std::vector<MatvecGroupItem> items;
        for (int i = 0; i < n; ++i) items.push_back({&dw[size_t(i)]->m, dy.as<float>() + off[size_t(i)]});
        launch_matvec_prequantized_group(items.data(), n, dx.as<float>(), n_vec, ws.p, nullptr);
        ck(cudaDeviceSynchronize(), "grouped matvec");
        const auto y = download<float>(dy, total);
        for (int i = 0; i < n; ++i) {
          SCOPED_TRACE("matrix " + std::to_string(i) + " of " + std::to_string(gc.rows[size_t(i)]) + " rows");
          const size_t ny = size_t(n_vec) * size_t(gc.rows[size_t(i)]);
          DevMem dsep(ny * 4);
          dsep.poison();
          if (ny > 0) {
            launch_matvec_prequantized(dw[size_t(i)]->m, dx.as<float>(), n_vec, dsep.as<float>(), false, ws.p,
                                       nullptr);
          }
          ck(cudaDeviceSynchronize(), "separate matvec");
          const auto sep = download<float>(dsep, ny);
          ASSERT_TRUE(same_bits(y.data() + off[size_t(i)], sep.data(), ny)) << "grouped vs separate launch";
          const BlockMatvecKernel arith = arithmetic_of(kernel, layout);
          if (gc.emulate && (arith == BlockMatvecKernel::Chunked || is_float_type(t))) {  // tiled: separate launches
            const std::vector<float> want = emulate_matvec(h[size_t(i)], x, n_vec, arith);
            ASSERT_TRUE(same_bits(y.data() + off[size_t(i)], want.data(), ny)) << "grouped vs CPU emulation";
          }
        }
        // The guards are still 0xffffffff (dy.poison()).
        const std::vector<float> poison(kGuard, y[0]);
        for (int i = 0; i <= n; ++i) {
          const size_t g = i == 0 ? 0 : off[size_t(i - 1)] + size_t(n_vec) * size_t(gc.rows[size_t(i - 1)]);
          ASSERT_TRUE(same_bits(y.data() + g, poison.data(), kGuard)) << "written outside the outputs, guard " << i;
        }
      }
    }
  }
}

std::string name_of(const ::testing::TestParamInfo<TensorType>& info) { return gguf::type_name(info.param); }

INSTANTIATE_TEST_SUITE_P(AllTypes, MatvecGroup, ::testing::ValuesIn(all_types()), name_of);

}  // namespace
}  // namespace activekv::cuda
