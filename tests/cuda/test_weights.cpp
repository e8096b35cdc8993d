// GPU weight kernels (quant_matvec.h) against the CPU dequantiser, per type:
// matvec vs a CPU emulation of its own arithmetic and vs fp64 with the
// unquantised x, gather and bf16 dequantisation bitwise, accumulate and
// prequantised modes, argument errors, and types.gguf through the gather.
// Labelled `gpu` (tests/cuda/CMakeLists.txt).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "activekv/core/bf16.h"
#include "activekv/gguf/gguf.h"
#include "matvec_test_util.h"
#include "mma_matvec.h"
#include "quant_split.cuh"

namespace activekv::cuda {
namespace {

using namespace wtest;

#define NEED_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device"

std::string source_dir() {
  const char* env = std::getenv("ACTIVEKV_SOURCE_DIR");  // a checkout elsewhere than at build time
  return env ? env : ACTIVEKV_SOURCE_DIR;
}

std::string name_of(const ::testing::TestParamInfo<TensorType>& info) { return gguf::type_name(info.param); }

class WeightKernels : public ::testing::TestWithParam<TensorType> {};

TEST_P(WeightKernels, MatvecMatchesCpu) {
  NEED_GPU();
  const TensorType t = GetParam();
  const double emul_bound = is_float_type(t) ? kEmulBoundFloat : kEmulBoundQuant;
  for (const WeightLayout layout : layouts_for(t))
  for (const int depth : depths_for(layout))
  for (const BlockMatvecKernel kernel : kernels_for(t)) {
    const KernelScope scope(kernel);
    const SplitDepthScope depth_scope(depth);
    MatvecErrors worst;
    uint64_t seed = 1000 + uint64_t(t);
    for (const Shape& s : shapes_for(t)) {
      const HostMatrix h = random_matrix(t, s.rows, s.cols, seed++);
      const std::vector<float> wd = h.dequant();
      DeviceCopy dw(h, layout);
      for (int n_vec : {1, 2, 8}) {
        const std::vector<float> x = random_x(n_vec, s.cols, seed++);
        DevMem dx(x.size() * 4), dy(size_t(n_vec * s.rows) * 4), ws(matvec_workspace_bytes(s.cols, n_vec));
        upload(dx, x);
        dy.poison();
        ws.poison();
        launch_matvec(dw.m, dx.as<float>(), n_vec, dy.as<float>(), false, ws.p, nullptr);
        ck(cudaDeviceSynchronize(), "matvec");
        const auto y = download<float>(dy, size_t(n_vec * s.rows));
        SCOPED_TRACE(gguf::type_name(t) + " " + kernel_name(kernel) + " " + layout_name(layout) + " depth " +
                     std::to_string(depth) + " " + std::to_string(s.rows) + "x" + std::to_string(s.cols) + " n_vec " +
                     std::to_string(n_vec));
        // The kernel's arithmetic, replayed on the CPU (matvec_emulation.h): equal bits.
        const std::vector<float> want = emulate_matvec(h, x, n_vec, arithmetic_of(kernel, layout));
        EXPECT_TRUE(same_bits(y.data(), want.data(), y.size())) << "GPU matvec vs its CPU emulation";
        const MatvecErrors e = compare_matvec(h, wd, x, n_vec, y, emul_bound);
        EXPECT_LE(e.rel_emul, emul_bound);
        if (!is_float_type(t)) {
          EXPECT_LE(e.worst_ratio, kWorstRatioBound);
          EXPECT_LE(e.z, kZBound);
        }
        worst.merge(e);
      }
    }
    std::printf("[measured] %-5s %-8s %-5s depth %d matvec: max rel err vs CPU emulation %.3g (bound %.3g); vs fp64 "
                "with exact x: %.3g of the hard bound (bound %.3g), max z %.3g (bound %.3g)\n",
                gguf::type_name(t).c_str(), kernel_name(kernel), layout_name(layout), depth, worst.rel_emul, emul_bound, worst.worst_ratio,
                kWorstRatioBound, worst.z, kZBound);
  }
}

TEST_P(WeightKernels, EveryBatchSizeAccumulateAndPrequantized) {
  NEED_GPU();
  const TensorType t = GetParam();
  // 1101 rows: the tiled kernel puts 2 rows in a CTA (the last CTA has 1 row).
  const Shape s{1101, 512};
  const HostMatrix h = random_matrix(t, s.rows, s.cols, 77 + uint64_t(t));
  for (const WeightLayout layout : layouts_for(t))
  for (const int depth : depths_for(layout))
  for (const BlockMatvecKernel kernel : kernels_for(t)) {
    const KernelScope scope(kernel);
    const SplitDepthScope depth_scope(depth);
    DeviceCopy dw(h, layout);
    for (int n_vec = 1; n_vec <= kMaxMatvecVectors; ++n_vec) {
      SCOPED_TRACE(std::string(kernel_name(kernel)) + " " + layout_name(layout) + " depth " + std::to_string(depth) +
                   " n_vec " + std::to_string(n_vec));
      const size_t ny = size_t(n_vec * s.rows);
      const std::vector<float> x = random_x(n_vec, s.cols, 500 + n_vec);
      std::vector<float> y0(ny);
      Rng rng(900 + n_vec);
      for (auto& v : y0) v = float(rng.uniform(-4, 4));
      DevMem dx(x.size() * 4), dy(ny * 4), dy2(ny * 4), ws(matvec_workspace_bytes(s.cols, n_vec));
      upload(dx, x);
      dy.poison();
      ws.poison();
      launch_matvec(dw.m, dx.as<float>(), n_vec, dy.as<float>(), false, ws.p, nullptr);
      upload(dy2, y0);
      launch_matvec(dw.m, dx.as<float>(), n_vec, dy2.as<float>(), true, ws.p, nullptr);
      ck(cudaDeviceSynchronize(), "matvec");
      const auto y = download<float>(dy, ny), yacc = download<float>(dy2, ny);
      const std::vector<float> want = emulate_matvec(h, x, n_vec, arithmetic_of(kernel, layout));
      ASSERT_TRUE(same_bits(y.data(), want.data(), ny)) << "GPU matvec vs its CPU emulation";
      // Accumulate adds the same (deterministic) dot to y in place: fp32 y0 + dot, bitwise.
      for (size_t i = 0; i < ny; ++i) {
        ASSERT_EQ(yacc[i], y0[i] + y[i]) << "accumulate, element " << i;
      }
      // Prequantised: quantise once, then the weight kernel alone gives the same bits.
      if (!is_float_type(t)) {
        DevMem ws2(matvec_workspace_bytes(s.cols, n_vec)), dy3(ny * 4);
        ws2.poison();
        dy3.poison();
        launch_quantize_activations(dx.as<float>(), s.cols, n_vec, ws2.p, nullptr);
        launch_matvec_prequantized(dw.m, nullptr, n_vec, dy3.as<float>(), false, ws2.p, nullptr);
        ck(cudaDeviceSynchronize(), "prequantized matvec");
        const auto y3 = download<float>(dy3, ny);
        ASSERT_EQ(0, std::memcmp(y.data(), y3.data(), ny * 4)) << "prequantized differs from launch_matvec";
      }
    }
  }
}

// fp32 activations (the CPU path's arithmetic): y against the fp64 dot of the
// dequantised weights with the same x, relative to sum |w x|. Measured on the
// H200 at 486ee2a (and since): at most 4.9e-8 over every type and shape (the
// inputs are seeded, the kernel deterministic); asserted at ~3x, 1.5e-7 --
// well inside the kernel's worst case, (cols/32 + 5) roundings of 2^-24.
TEST_P(WeightKernels, MatvecF32ActivationsMatchesFp64) {
  NEED_GPU();
  const TensorType t = GetParam();
  double worst = 0;
  uint64_t seed = 3000 + uint64_t(t);
  for (const Shape& s : shapes_for(t)) {
    const HostMatrix h = random_matrix(t, s.rows, s.cols, seed++);
    const std::vector<float> wd = h.dequant();
    constexpr double bound = 1.5e-7;
    for (int n_vec : {1, 3}) {
    const std::vector<float> x = random_x(n_vec, s.cols, seed++);
    std::vector<float> gguf_y;  // y on the GGUF layout: the split one must give the same bits
    for (const WeightLayout layout : layouts_for(t)) {
      DeviceCopy dw(h, layout);
      DevMem dx(x.size() * 4), dy(size_t(n_vec * s.rows) * 4);
      upload(dx, x);
      dy.poison();
      launch_matvec_f32_activations(dw.m, dx.as<float>(), n_vec, dy.as<float>(), false, nullptr);
      ck(cudaDeviceSynchronize(), "matvec f32 activations");
      const auto y = download<float>(dy, size_t(n_vec * s.rows));
      SCOPED_TRACE(gguf::type_name(t) + " " + layout_name(layout) + " " + std::to_string(s.rows) + "x" +
                   std::to_string(s.cols));
      if (layout == WeightLayout::Gguf) gguf_y = y;
      else ASSERT_TRUE(same_bits(y.data(), gguf_y.data(), y.size())) << "split layout vs GGUF layout";
      for (int v = 0; v < n_vec; ++v)
        for (int64_t r = 0; r < s.rows; ++r) {
          double dot = 0, mag = 0;
          for (int64_t c = 0; c < s.cols; ++c) {
            const double p = double(wd[size_t(r * s.cols + c)]) * double(x[size_t(v * s.cols + c)]);
            dot += p;
            mag += std::fabs(p);
          }
          const double rel = mag > 0 ? std::fabs(double(y[size_t(v * s.rows + r)]) - dot) / mag : 0;
          worst = std::max(worst, rel);
          ASSERT_LE(rel, bound) << "row " << r << " vector " << v;
        }
    }
    }
  }
  std::printf("[measured] %-5s matvec, fp32 activations: max |y - fp64| / sum|w x| = %.3g\n",
              gguf::type_name(t).c_str(), worst);
}

TEST_P(WeightKernels, GatherAndDequantizeBf16Bitwise) {
  NEED_GPU();
  const TensorType t = GetParam();
  for (bool raw : {false, true}) {
    if (raw && !is_float_type(t)) continue;  // random bits: NaN/inf/subnormal conversions
    for (const Shape& s : shapes_for(t)) {
      SCOPED_TRACE(std::to_string(s.rows) + "x" + std::to_string(s.cols) + (raw ? " raw bits" : ""));
      const HostMatrix h = random_matrix(t, s.rows, s.cols, 3000 + uint64_t(t) * 7 + uint64_t(s.cols), raw);
      const std::vector<float> wd = h.dequant();
      for (const WeightLayout layout : layouts_for(t)) {
      SCOPED_TRACE(layout_name(layout));
      DeviceCopy dw(h, layout);
      // Gather: first, last, a repeat, and one id out of range (NaN row).
      const std::vector<int32_t> ids = {int32_t(s.rows - 1), 0, 5, 5, int32_t(s.rows), 17};
      DevMem dids(ids.size() * 4), dout(ids.size() * size_t(s.cols) * 4);
      upload(dids, ids);
      dout.poison();
      launch_gather_rows_f32(dw.m, dids.as<int32_t>(), int(ids.size()), dout.as<float>(), nullptr);
      ck(cudaDeviceSynchronize(), "gather");
      const auto got = download<float>(dout, ids.size() * size_t(s.cols));
      for (size_t i = 0; i < ids.size(); ++i) {
        const float* g = got.data() + i * s.cols;
        if (ids[i] >= s.rows) {
          for (int64_t c = 0; c < s.cols; ++c) ASSERT_TRUE(std::isnan(g[c])) << "out-of-range id, col " << c;
          continue;
        }
        ASSERT_TRUE(same_bits(g, wd.data() + ids[i] * s.cols, size_t(s.cols))) << "gather of row " << ids[i];
      }
      // bf16 rows [row0, row0 + n) with round-to-nearest-even.
      const int64_t row0 = 3, n = s.rows - 5;
      DevMem dbf(size_t(n * s.cols) * 2);
      dbf.poison();
      launch_dequantize_bf16(dw.m, row0, n, dbf.p, nullptr);
      ck(cudaDeviceSynchronize(), "dequantize bf16");
      const auto gbf = download<uint16_t>(dbf, size_t(n * s.cols));
      std::vector<uint16_t> want(size_t(n * s.cols));
      for (size_t i = 0; i < want.size(); ++i) want[i] = f32_to_bf16(wd[size_t(row0 * s.cols) + i]).bits;
      ASSERT_TRUE(same_bits(gbf.data(), want.data(), want.size())) << "dequantize_bf16";
      }
    }
  }
}

// 2..8 vectors through the tensor-core kernel (mma_matvec.cu, on for the
// test): it reads the block dots off mma.m16n8k32 and sums them per lane
// slot and by the butterfly's tree, so every y must be bitwise the CPU
// emulation of the chunked kernel (which the register kernel equals), for
// every vector count, written and accumulated -- on shapes whose rows are 1
// to 5 blocks a slot (most slots empty at 256 columns) and row counts not a
// multiple of the 16-row tile (grouped launches: test_matvec_group.cpp);
// 17408 columns (past the tile's 8192) and 576 (heads not whole 16-byte
// pieces) stay on the register kernel.
// Types the kernel does not read (Q5_0, the K-quants) stay on the register
// kernel and must give the same bits too.
TEST_P(WeightKernels, MmaVectorsAreTheChunkedKernelsBits) {
  NEED_GPU();
  const TensorType t = GetParam();
  if (!has_split_layout(t)) GTEST_SKIP() << "no split layout: the mma kernel does not read it";
  struct MmaScope {
    mvhost::MmaMatvec before = mvhost::mma_matvec();
    MmaScope() { mvhost::set_mma_matvec(mvhost::MmaMatvec::On); }
    ~MmaScope() {
      mvhost::set_mma_matvec(before);
      mmamv::set_grid_cap(0);
    }
  } scope;
  const bool k32 = gguf::block_elements(t) <= 32;
  uint64_t seed = 9000 + uint64_t(t);
  // 8192 columns: the widest row (256 blocks, whole pieces only) and, at 8
  // vectors, the 4-stage ring of the 4-bit types; 6144: Q4_1's 4-stage ring;
  // 640 (20 blocks): Q4_1 only, whose 4-byte heads make whole pieces at a
  // multiple of 4 blocks (added after a review, session 23: never run before).
  for (const Shape& s : std::vector<Shape>{{1101, 256}, {301, 1536}, {67, 5120}, {19, 17408}, {2050, k32 ? 576 : 768},
                                           {37, 8192}, {45, 6144}, {45, k32 ? 640 : 768}}) {
    const HostMatrix h = random_matrix(t, s.rows, s.cols, seed++);
    DeviceCopy dw(h, WeightLayout::Split);
    // Which launches the mma kernel takes, so that a fallback to the
    // register kernel cannot pass for it: its types at 256, 1536, 5120, 6144
    // and 8192 columns, Q4_1 at 640; not 17408 (past 8192) nor 576 (heads
    // not 16-byte pieces).
    const bool mma_type = t == TensorType::Q4_0 || t == TensorType::Q4_1 || t == TensorType::Q8_0;
    const bool mma_expected =
        mma_type && (s.cols == 256 || s.cols == 1536 || s.cols == 5120 || s.cols == 6144 || s.cols == 8192 ||
                     (t == TensorType::Q4_1 && s.cols == 640));
    EXPECT_EQ(mmamv::reads(dw.m, 2), mma_expected) << s.rows << "x" << s.cols;
    EXPECT_FALSE(mmamv::reads(dw.m, 1)) << "one vector stays on the register kernel";
    if (mma_expected) {  // and this device's shared memory holds x and the ring (else run declines)
      int dev = 0, smem = 0;
      ck(cudaGetDevice(&dev), "cudaGetDevice");
      ck(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "shared memory a CTA");
      EXPECT_GE(mmamv::ring_stages(dw.m, kMaxMatvecVectors, smem), 4) << "this GPU cannot run the mma kernel";
    }
    // Grid caps: one CTA a SM (here at most 69 tiles: a tile a CTA), and 1
    // and 3 CTAs, so that a CTA walks many tiles and its ring wraps.
    for (const int cap : {0, 1, 3})
    for (int n_vec = 2; n_vec <= kMaxMatvecVectors; ++n_vec) {
      mmamv::set_grid_cap(cap);
      SCOPED_TRACE(gguf::type_name(t) + " " + std::to_string(s.rows) + "x" + std::to_string(s.cols) + " n_vec " +
                   std::to_string(n_vec) + " grid cap " + std::to_string(cap));
      const std::vector<float> x = random_x(n_vec, s.cols, seed++);
      const std::vector<float> want = emulate_matvec(h, x, n_vec, BlockMatvecKernel::Chunked);
      const size_t n_out = size_t(n_vec) * size_t(s.rows);
      std::vector<float> y0(n_out);
      Rng rng(seed++);
      for (auto& v : y0) v = float(rng.uniform(-4, 4));
      DevMem dx(x.size() * 4), dy(n_out * 4), ws(matvec_workspace_bytes(s.cols, n_vec));
      upload(dx, x);
      dy.poison();
      launch_matvec(dw.m, dx.as<float>(), n_vec, dy.as<float>(), false, ws.p, nullptr);
      ck(cudaDeviceSynchronize(), "mma matvec");
      const auto y = download<float>(dy, n_out);
      ASSERT_TRUE(same_bits(y.data(), want.data(), n_out)) << "mma matvec vs its CPU emulation";
      upload(dy, y0);
      launch_matvec(dw.m, dx.as<float>(), n_vec, dy.as<float>(), true, ws.p, nullptr);
      ck(cudaDeviceSynchronize(), "mma matvec, accumulate");
      const auto yacc = download<float>(dy, n_out);
      for (size_t i = 0; i < n_out; ++i) ASSERT_EQ(yacc[i], y0[i] + y[i]) << "accumulate, element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, WeightKernels, ::testing::ValuesIn(all_types()), name_of);

// ---- types.gguf: gguf-py's own expected dequantisation -------------------------

/// types.expected.bin (tools/make_gguf_fixtures.py): "AKVX", count, then per
/// tensor name and float32 values.
std::vector<std::pair<std::string, std::vector<float>>> read_expected(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  auto u32 = [&] {
    uint32_t v = 0;
    in.read(reinterpret_cast<char*>(&v), 4);
    return v;
  };
  if (u32() != 0x58564b41u) throw std::runtime_error(path + ": bad magic");
  std::vector<std::pair<std::string, std::vector<float>>> out(u32());
  for (auto& [name, vals] : out) {
    name.resize(u32());
    in.read(name.data(), std::streamsize(name.size()));
    uint64_t n = 0;
    in.read(reinterpret_cast<char*>(&n), 8);
    vals.resize(n);
    in.read(reinterpret_cast<char*>(vals.data()), std::streamsize(n * 4));
  }
  if (!in) throw std::runtime_error(path + ": truncated");
  return out;
}

TEST(WeightKernelsFixture, TypesGgufGatherIsBitExact) {
  NEED_GPU();
  const std::string dir = source_dir() + "/tests/fixtures/gguf/";
  const gguf::File f = gguf::File::open(dir + "types.gguf");
  const auto expected = read_expected(dir + "types.expected.bin");
  ASSERT_EQ(expected.size(), 9u);
  for (const auto& [name, want] : expected) {
    SCOPED_TRACE(name);
    const gguf::TensorInfo& ti = f.tensor(name);
    ASSERT_EQ(ti.dims.size(), 2u);
    HostMatrix h{ti.type, int64_t(ti.dims[1]), int64_t(ti.dims[0]), gguf::row_bytes(ti.type, ti.dims[0]),
                 std::vector<uint8_t>(ti.data, ti.data + ti.n_bytes)};
    DeviceCopy dw(h);
    const std::vector<int32_t> ids = {0, 1};
    DevMem dids(8), dout(want.size() * 4);
    upload(dids, ids);
    dout.poison();
    launch_gather_rows_f32(dw.m, dids.as<int32_t>(), 2, dout.as<float>(), nullptr);
    ck(cudaDeviceSynchronize(), "gather");
    const auto got = download<float>(dout, want.size());
    EXPECT_TRUE(same_bits(got.data(), want.data(), want.size()));
  }
}

// ---- the split layout ---------------------------------------------------------------

// The GPU repack puts every byte where quant_split.cuh's offsets (which every
// reader uses) say: each block read back through SplitPtr is the GGUF block.
TEST(SplitLayout, RepackPutsEveryBlockWhereTheReadersLook) {
  NEED_GPU();
  for (const TensorType t : all_types()) {
    if (!has_split_layout(t)) continue;
    qblk::dispatch_block_type(t, [&](auto traits) {
      using T = decltype(traits);
      if constexpr (qsplit::SplitOf<T>::kOk) {
        const HostMatrix h = random_matrix(t, 37, 512, 4242 + uint64_t(t));  // Q6_K: 2 super-blocks
        DeviceCopy dw(h, WeightLayout::Split);
        const auto got = download<uint8_t>(dw.mem, h.bytes.size());
        const int64_t n_blocks = h.cols / T::kElems;
        uint8_t block[T::kBytes];
        for (int64_t r = 0; r < h.rows; ++r)
          for (int64_t b = 0; b < n_blocks; ++b) {
            qsplit::gguf_block(qsplit::split_block<T>(got.data(), h.rows, r, b, n_blocks), block);
            ASSERT_EQ(0, std::memcmp(block, h.bytes.data() + r * h.row_bytes + b * T::kBytes, T::kBytes))
                << gguf::type_name(t) << " row " << r << " block " << b;
          }
      }
    });
  }
}

// ---- argument errors ---------------------------------------------------------------

template <class F>
std::string thrown_message(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

TEST(WeightKernelsErrors, UnsupportedTypesAndBadShapesThrow) {
  NEED_GPU();
  DevMem buf(1 << 20), x(1 << 16), y(1 << 16), ws(1 << 16);
  // Every named type has a kernel (Q5_0 since Gemma 3 on the GPU); ggml's Q5_1
  // (id 7) is one we do not read at all.
  const auto q5_1 = TensorType(7);
  EXPECT_FALSE(has_gpu_kernel(q5_1));
  for (TensorType t : all_types()) EXPECT_TRUE(has_gpu_kernel(t)) << gguf::type_name(t);
  EXPECT_NE(thrown_message([&] { require_gpu_kernel("blk.3.ffn_down.weight", q5_1); }).find("blk.3.ffn_down.weight"),
            std::string::npos);
  EXPECT_NE(thrown_message([&] { require_gpu_kernel("t", q5_1); }).find("type#7"), std::string::npos);

  const DeviceMatrix good{TensorType::Q4_K, buf.p, 10, 512, gguf::row_bytes(TensorType::Q4_K, 512)};
  auto mv = [&](DeviceMatrix m, int n_vec = 1) {
    return thrown_message([&] { launch_matvec(m, x.as<float>(), n_vec, y.as<float>(), false, ws.p, nullptr); });
  };
  EXPECT_EQ(mv(good), "(nothing thrown)");
  DeviceMatrix m = good;
  m.type = q5_1;
  EXPECT_NE(mv(m).find("type#7"), std::string::npos) << mv(m);
  m = good;
  m.cols = 576;  // 2.25 super-blocks
  m.row_bytes = 0;
  EXPECT_NE(mv(m).find("Q4_K matrix of 10 rows x 576 cols"), std::string::npos) << mv(m);
  m = good;
  m.row_bytes += 2;
  EXPECT_NE(mv(m).find("row_bytes"), std::string::npos) << mv(m);
  m = good;
  m.data = buf.as<uint8_t>() + 2;
  EXPECT_NE(mv(m).find("16-byte aligned"), std::string::npos) << mv(m);
  EXPECT_NE(mv(good, 0).find("n_vec 0"), std::string::npos);
  EXPECT_NE(mv(good, 9).find("n_vec 9"), std::string::npos);
  EXPECT_NE(thrown_message([&] { launch_matvec(good, x.as<float>(), 1, y.as<float>(), false, nullptr, nullptr); })
                .find("workspace"),
            std::string::npos);
  EXPECT_NE(thrown_message([&] { launch_dequantize_bf16(good, 8, 3, y.p, nullptr); }).find("outside the 10 rows"),
            std::string::npos);
  EXPECT_NE(thrown_message([&] { (void)matvec_workspace_bytes(100, 1); }).find("cols 100"), std::string::npos);
  DeviceMatrix f16{TensorType::F16, buf.p, 4, 12, 24};  // cols not a multiple of 8
  EXPECT_NE(mv(f16).find("multiple of 8"), std::string::npos) << mv(f16);
  // The split layout: only for Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K; the repack
  // needs a split destination and a source that does not overlap it.
  m = DeviceMatrix{TensorType::Q5_K, buf.p, 10, 512, gguf::row_bytes(TensorType::Q5_K, 512), WeightLayout::Split};
  EXPECT_NE(mv(m).find("Q5_K matrix (split layout) of 10 rows x 512 cols: the split layout exists for"),
            std::string::npos)
      << mv(m);
  const DeviceMatrix q4{TensorType::Q4_0, buf.as<uint8_t>() + 4096, 10, 512, gguf::row_bytes(TensorType::Q4_0, 512),
                        WeightLayout::Split};
  EXPECT_NE(thrown_message([&] { launch_repack_split(buf.p, DeviceMatrix{q4.type, q4.data, 10, 512, q4.row_bytes}, nullptr); })
                .find("must be Split"),
            std::string::npos);
  EXPECT_NE(thrown_message([&] { launch_repack_split(buf.as<uint8_t>() + 4096 + 64, q4, nullptr); }).find("overlaps"),
            std::string::npos);
  EXPECT_EQ(thrown_message([&] { launch_repack_split(buf.p, q4, nullptr); }), "(nothing thrown)");
  ck(cudaDeviceSynchronize(), "good launch");
}

}  // namespace
}  // namespace activekv::cuda
