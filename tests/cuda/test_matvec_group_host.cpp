// Host half of the grouped matvec (launch_matvec_prequantized_group,
// src/cuda/matvec_host.h): its argument checks (one line naming the matrix
// and the problem, thrown before anything is launched) and its grid -- which
// CTAs each matrix owns, and the one rows-per-warp choice for the launch.
// No GPU needed: the pointers are never dereferenced here. The GPU half is
// test_matvec_group.cpp.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "activekv/core/error.h"
#include "matvec_host.h"
#include "mma_matvec.h"

namespace activekv::cuda {
namespace {

using gguf::TensorType;

/// A fake device address (16-byte aligned, never dereferenced).
template <class T = void>
T* fake(uintptr_t a) {
  return reinterpret_cast<T*>(a);
}

DeviceMatrix mat(TensorType t, int64_t rows, int64_t cols) {
  return {t, fake(uintptr_t(1) << 24), rows, cols, gguf::row_bytes(t, uint64_t(cols))};
}

void* const kWs = fake(uintptr_t(1) << 30);  // 256-byte aligned
const float* const kX = fake<const float>(uintptr_t(1) << 31);

/// Items for `ms`, outputs laid out one after another (disjoint) for n_vec vectors.
std::vector<MatvecGroupItem> items_for(const std::vector<DeviceMatrix>& ms, int n_vec) {
  std::vector<MatvecGroupItem> it;
  uintptr_t y = uintptr_t(1) << 32;
  for (const DeviceMatrix& m : ms) {
    it.push_back({&m, fake<float>(y)});
    y += 4 * uintptr_t(n_vec) * uintptr_t(m.rows) + 256;
  }
  return it;
}

mvhost::GroupPlan plan(const std::vector<DeviceMatrix>& ms, int n_vec,
                       BlockMatvecKernel k = BlockMatvecKernel::Chunked) {
  const auto it = items_for(ms, n_vec);
  return mvhost::plan_group(it.data(), int(it.size()), kX, n_vec, kWs, k);
}

std::vector<uint32_t> ends(const mvhost::GroupPlan& p) { return {p.cta_end, p.cta_end + p.n}; }

bool rows_forced() { return std::getenv("ACTIVEKV_MATVEC_ROWS") != nullptr; }

// Which rows-per-warp rule holds: one choice for the launch, from its total
// rows. In the 27B QKV group (Q4_0, one vector) K and V (1024 rows) run with
// 2 rows per warp, where alone they take 1 (too few rows); each row's sum
// does not depend on it, and test_matvec_group.cpp holds their outputs
// bitwise the separate launches'.
TEST(MatvecGroupPlan, OneRowsPerWarpForTheLaunch) {
  if (rows_forced()) GTEST_SKIP() << "ACTIVEKV_MATVEC_ROWS forces the choice";
  const std::vector<DeviceMatrix> qkv = {mat(TensorType::Q4_0, 6144, 5120), mat(TensorType::Q4_0, 1024, 5120),
                                         mat(TensorType::Q4_0, 1024, 5120)};
  EXPECT_EQ(mvhost::chunked_rows_per_warp(1024, 1, 18, 32), 1);
  EXPECT_EQ(mvhost::chunked_rows_per_warp(6144, 1, 18, 32), 2);
  mvhost::GroupPlan p = plan(qkv, 1);
  EXPECT_EQ(p.rows_per_warp, 2);
  EXPECT_TRUE(p.one_launch);
  // 6144 rows / 2 per warp / 4 warps per CTA = 768 CTAs; 1024 rows: 128.
  EXPECT_EQ(ends(p), (std::vector<uint32_t>{768, 896, 1024}));
  // Batches: 2 rows per warp (each x load serves both), 4 for 8 vectors.
  p = plan(qkv, 2);
  EXPECT_EQ(p.rows_per_warp, 2);
  EXPECT_EQ(ends(p), (std::vector<uint32_t>{768, 896, 1024}));
  p = plan(qkv, mvhost::kRowsFourVectors);
  EXPECT_EQ(p.rows_per_warp, 4);  // 6144 / 4 / 4 = 384 CTAs; 1024 rows: 64
  EXPECT_EQ(ends(p), (std::vector<uint32_t>{384, 448, 512}));
  EXPECT_EQ(mvhost::chunked_rows_per_warp(2048, 8, 18, 32), 1);  // too few rows: 1, any vector count
  EXPECT_EQ(mvhost::chunked_rows_per_warp(6144, 3, 34, 32), 2);  // Q8_0 too, with several vectors
  EXPECT_EQ(mvhost::chunked_rows_per_warp(6144, 8, 34, 32), 2);  // but 4 rows only for 4-bit types
  EXPECT_EQ(mvhost::chunked_rows_per_warp(6144, 8, 210, 256), 2);  // Q6_K
  // Q8_0 (8.5 bits per element) keeps 1 row per warp.
  p = plan({mat(TensorType::Q8_0, 6144, 5120), mat(TensorType::Q8_0, 1024, 5120)}, 1);
  EXPECT_EQ(p.rows_per_warp, 1);
  EXPECT_EQ(ends(p), (std::vector<uint32_t>{1536, 1792}));
  // gate/up, Q4_K: 17408 / 2 / 4 = 2176 CTAs each.
  p = plan({mat(TensorType::Q4_K, 17408, 5120), mat(TensorType::Q4_K, 17408, 5120)}, 1);
  EXPECT_EQ(p.rows_per_warp, 2);
  EXPECT_EQ(ends(p), (std::vector<uint32_t>{2176, 4352}));
  // Small matrices that reach 4096 rows together: 2 rows per warp; an empty
  // matrix owns no CTA; odd rows round up to whole warps and CTAs.
  p = plan({mat(TensorType::Q4_0, 4099, 256), mat(TensorType::Q4_0, 0, 256), mat(TensorType::Q4_0, 5, 256)}, 1);
  EXPECT_EQ(p.rows_per_warp, 2);
  EXPECT_EQ(ends(p), (std::vector<uint32_t>{513, 513, 514}));
}

TEST(MatvecGroupPlan, FloatTypesAndTheTiledKernel) {
  // Float types: one launch, one row per warp, whatever the block kernel.
  const std::vector<DeviceMatrix> f = {mat(TensorType::F16, 4096, 512), mat(TensorType::F16, 9, 512)};
  for (auto k : {BlockMatvecKernel::Chunked, BlockMatvecKernel::Tiled}) {
    const mvhost::GroupPlan p = plan(f, 1, k);
    EXPECT_TRUE(p.one_launch);
    EXPECT_EQ(p.rows_per_warp, 1);
    EXPECT_EQ(ends(p), (std::vector<uint32_t>{1024, 1027}));
  }
  // The tiled block kernel: one launch per matrix (its sums depend on each matrix's CTA geometry).
  EXPECT_FALSE(plan({mat(TensorType::Q4_0, 64, 512)}, 1, BlockMatvecKernel::Tiled).one_launch);
  // Split matrices run the register kernel whichever block kernel is selected: one launch.
  DeviceMatrix split = mat(TensorType::Q4_0, 64, 512);
  split.layout = WeightLayout::Split;
  EXPECT_TRUE(plan({split}, 1, BlockMatvecKernel::Tiled).one_launch);
}

template <class F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

TEST(MatvecGroupPlan, BadGroupsThrowOneLine) {
  const DeviceMatrix q = mat(TensorType::Q4_0, 6144, 5120), k = mat(TensorType::Q4_0, 1024, 5120);
  auto msg = [](std::vector<MatvecGroupItem> it, int n_vec = 1, const void* ws = kWs, const float* x = kX) {
    return thrown(
        [&] { (void)mvhost::plan_group(it.data(), int(it.size()), x, n_vec, ws, BlockMatvecKernel::Chunked); });
  };
  EXPECT_EQ(msg(items_for({q, k, k}, 1)), "(nothing thrown)");
  EXPECT_EQ(msg({}), "matvec group: 0 matrices (1..4 allowed)");
  const std::vector<DeviceMatrix> five(5, k);
  EXPECT_EQ(msg(items_for(five, 1)), "matvec group: 5 matrices (1..4 allowed)");
  // (items_for points into its argument: the matrices outlive the items)
  const std::vector<DeviceMatrix> qk = {q, k}, qkk = {q, k, k};
  auto it = items_for(qk, 1);
  it[1].w = nullptr;
  EXPECT_EQ(msg(it), "matvec group: matrix 1 has a null matrix or output");
  it = items_for(qk, 1);
  it[0].y = nullptr;
  EXPECT_EQ(msg(it), "matvec group: matrix 0 has a null matrix or output");
  const DeviceMatrix k4 = mat(TensorType::Q4_K, 1024, 5120);
  EXPECT_EQ(msg(items_for({q, k4}, 1)),
            "matvec group: matrix 1 (Q4_K matrix of 1024 rows x 5120 cols) does not match matrix 0 (Q4_0 matrix of "
            "6144 rows x 5120 cols): one type, layout and column count per group");
  DeviceMatrix k_split = k;
  k_split.layout = WeightLayout::Split;
  EXPECT_EQ(msg(items_for({q, k_split}, 1)),
            "matvec group: matrix 1 (Q4_0 matrix (split layout) of 1024 rows x 5120 cols) does not match matrix 0 "
            "(Q4_0 matrix of 6144 rows x 5120 cols): one type, layout and column count per group");
  const DeviceMatrix wide = mat(TensorType::Q4_0, 1024, 6144);
  EXPECT_NE(msg(items_for({q, k, wide}, 1)).find("matrix 2 (Q4_0 matrix of 1024 rows x 6144 cols) does not match"),
            std::string::npos);
  // Outputs: matrix 2's starts inside matrix 0's.
  it = items_for(qkk, 1);
  it[2].y = it[0].y + 6143;
  EXPECT_EQ(msg(it), "matvec group: the outputs of matrices 0 and 2 overlap");
  it[2].y = it[1].y + 1023;  // one float into matrix 1's
  EXPECT_EQ(msg(it), "matvec group: the outputs of matrices 1 and 2 overlap");
  it[2].y = it[1].y + 1024;  // right after matrix 1's: fine
  EXPECT_EQ(msg(it), "(nothing thrown)");
  // An empty matrix's output overlaps nothing.
  const std::vector<DeviceMatrix> q_empty = {q, mat(TensorType::Q4_0, 0, 5120)};
  it = items_for(q_empty, 1);
  it[1].y = it[0].y + 10;
  EXPECT_EQ(msg(it), "(nothing thrown)");
  // The single launch's checks, per matrix.
  EXPECT_EQ(msg(items_for({q, k}, 9), 9), "matvec: n_vec 9 is outside 1..8");
  EXPECT_EQ(msg(items_for({q, k}, 1), 1, nullptr),
            "matvec on Q4_0 matrix of 6144 rows x 5120 cols: the workspace must be non-null and 256-byte aligned");
  DeviceMatrix bad = k;
  bad.row_bytes += 2;
  EXPECT_NE(msg(items_for({q, bad}, 1)).find("row_bytes"), std::string::npos);
  // Float weights read x itself.
  const DeviceMatrix f = mat(TensorType::BF16, 64, 512);
  EXPECT_EQ(msg(items_for({f, f}, 1), 1, nullptr, nullptr),
            "matvec on BF16 matrix of 64 rows x 512 cols: x or y is null");
  // The public launch checks the same way, before any CUDA call (none happens here).
  const std::vector<DeviceMatrix> q_k4 = {q, k4};
  it = items_for(q_k4, 1);
  EXPECT_NE(thrown([&] { launch_matvec_prequantized_group(it.data(), 2, kX, 1, kWs, nullptr); }).find("does not match"),
            std::string::npos);
}

// The split layout's checks, made before anything reaches the GPU (so they
// run here, without one): which types have it, a split K-quant matrix, and
// the repack's destination and source.
TEST(SplitLayoutChecks, TypesAndBadRepacksThrowOneLine) {
  for (TensorType t : {TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_0, TensorType::Q8_0, TensorType::Q4_K,
                       TensorType::Q6_K})
    EXPECT_TRUE(has_split_layout(t)) << gguf::type_name(t);
  for (TensorType t : {TensorType::Q5_K, TensorType::F16, TensorType::F32})
    EXPECT_FALSE(has_split_layout(t)) << gguf::type_name(t);
  DeviceMatrix k5 = mat(TensorType::Q5_K, 10, 512);
  k5.layout = WeightLayout::Split;
  EXPECT_EQ(thrown([&] { validate_matrix(k5); }),
            "Q5_K matrix (split layout) of 10 rows x 512 cols: the split layout exists for Q4_0, Q4_1, Q5_0, Q8_0, "
            "Q4_K and Q6_K only");
  const DeviceMatrix gguf_q4 = mat(TensorType::Q4_0, 10, 512);
  EXPECT_EQ(thrown([&] { launch_repack_split(kWs, gguf_q4, nullptr); }),
            "repack: the destination's layout must be Split");
  DeviceMatrix q4 = gguf_q4;
  q4.layout = WeightLayout::Split;
  const auto* at = static_cast<const uint8_t*>(q4.data);
  EXPECT_EQ(thrown([&] { launch_repack_split(at + 100, q4, nullptr); }),
            "repack: the GGUF source of the Q4_0 matrix (split layout) of 10 rows x 512 cols is null or overlaps it");
  EXPECT_NE(thrown([&] { launch_repack_split(nullptr, q4, nullptr); }).find("is null or overlaps"), std::string::npos);
  EXPECT_EQ(thrown([] { mvhost::set_split_depth(3); }), "register matvec: split depth 3 is not 0 (the rule), 1 or 2");
  if (std::getenv("ACTIVEKV_SPLIT_DEPTH") == nullptr) EXPECT_EQ(mvhost::split_depth(), 0);  // the default: the rule
  if (std::getenv("ACTIVEKV_MATVEC_MMA") == nullptr) EXPECT_EQ(mvhost::mma_matvec(), mvhost::MmaMatvec::Rule);
}

// Which launches the tensor-core kernel for several vectors takes
// (mma_matvec.h), decided on the host without a device: under the mode
// (off; the rule: 8 vectors; on: 2..8), for vectors over a split
// Q4_0/Q4_1/Q8_0 matrix of at most 8192 columns whose
// payload and head rows are whole 16-byte pieces.
TEST(MmaMatvec, TakesSplitThirtyTwoElementTypesUpTo8192Columns) {
  struct Scope {
    mvhost::MmaMatvec before = mvhost::mma_matvec();
    ~Scope() { mvhost::set_mma_matvec(before); }
  } scope;
  auto split = [](TensorType t, int64_t rows, int64_t cols) {
    DeviceMatrix m = mat(t, rows, cols);
    m.layout = WeightLayout::Split;
    return m;
  };
  mvhost::set_mma_matvec(mvhost::MmaMatvec::Off);
  EXPECT_FALSE(mmamv::reads(split(TensorType::Q4_0, 17408, 5120), 8)) << "off";
  // The rule (the default): 8 vectors only, where it measured faster.
  mvhost::set_mma_matvec(mvhost::MmaMatvec::Rule);
  for (int n = 1; n <= kMaxMatvecVectors; ++n) {
    EXPECT_EQ(mvhost::mma_for(n), n == 8) << n << " vectors";
    EXPECT_EQ(mmamv::reads(split(TensorType::Q4_0, 17408, 5120), n), n == 8) << n << " vectors";
  }
  mvhost::set_mma_matvec(mvhost::MmaMatvec::On);
  for (TensorType t : {TensorType::Q4_0, TensorType::Q4_1, TensorType::Q8_0}) {
    SCOPED_TRACE(gguf::type_name(t));
    EXPECT_TRUE(mmamv::reads(split(t, 17408, 5120), 2));
    EXPECT_TRUE(mmamv::reads(split(t, 6144, 8192), 8));
    EXPECT_FALSE(mmamv::reads(split(t, 17408, 5120), 1));      // one vector: the register kernel
    EXPECT_FALSE(mmamv::reads(split(t, 5120, 17408), 8));      // wide: past the tile
    EXPECT_FALSE(mmamv::reads(split(t, 64, 576), 8));          // heads not whole 16-byte pieces
    EXPECT_FALSE(mmamv::reads(mat(t, 17408, 5120), 8));        // GGUF layout
  }
  for (TensorType t : {TensorType::Q5_0, TensorType::Q4_K, TensorType::Q6_K})
    EXPECT_FALSE(mmamv::reads(split(t, 17408, 5120), 8)) << gguf::type_name(t);
}

// The shared memory a CTA needs: x for every vector plus a ring of 64-block
// pieces. On sm_90 (232448 bytes a CTA, opt-in) every matrix reads() takes
// gets at least 4 pieces in flight -- the widest (8192 columns) of the
// largest type (Q8_0) at 8 vectors 4, Q4_0 at the model's 5120 columns 8;
// on a device with 100 KiB (sm_89) Q8_0 at 8192 columns does not fit and
// run keeps the register kernel.
TEST(MmaMatvec, RingFitsSm90SharedMemory) {
  constexpr int kSm90 = 232448, kSm89 = 101376;
  auto split = [](TensorType t, int64_t cols) {
    DeviceMatrix m = mat(t, 64, cols);
    m.layout = WeightLayout::Split;
    return m;
  };
  for (TensorType t : {TensorType::Q4_0, TensorType::Q4_1, TensorType::Q8_0})
    for (int64_t cols : {256, 1536, 5120, 6144, 8192})
      for (int n = 2; n <= kMaxMatvecVectors; ++n)
        EXPECT_GE(mmamv::ring_stages(split(t, cols), n, kSm90), 4) << gguf::type_name(t) << " " << cols << " " << n;
  EXPECT_EQ(mmamv::ring_stages(split(TensorType::Q8_0, 8192), 8, kSm90), 4);
  EXPECT_EQ(mmamv::ring_stages(split(TensorType::Q4_0, 5120), 8, kSm90), 8);
  EXPECT_EQ(mmamv::ring_stages(split(TensorType::Q8_0, 8192), 8, kSm89), 0);
}

// The register kernel's rows per warp and depth (matvec_host.h says what
// was measured): one row at depth 2 for one vector over a tall 4-bit
// matrix, one row at depth 1 over a wide one.
TEST(SplitShape, TallFourBitMatricesTakeOneRowPerWarpAtDepthTwo) {
  if (std::getenv("ACTIVEKV_SPLIT_DEPTH") != nullptr || std::getenv("ACTIVEKV_MATVEC_ROWS") != nullptr ||
      std::getenv("ACTIVEKV_WIDE_ROWS") != nullptr)
    GTEST_SKIP() << "the environment forces the shape";
  auto shape = [](int64_t rows, int64_t cols, int n_vec, int block_bytes) {
    const mvhost::SplitShape s = mvhost::split_shape(rows, cols, n_vec, block_bytes, 32);
    return std::make_pair(s.rows_per_warp, s.depth);
  };
  constexpr int kQ4_0 = 18, kQ4_1 = 20, kQ8_0 = 34;
  EXPECT_EQ(shape(17408, 5120, 1, kQ4_0), std::make_pair(1, 2));  // gate, up
  EXPECT_EQ(shape(32000, 5120, 1, kQ4_0), std::make_pair(1, 2));  // the output head
  EXPECT_EQ(shape(32000, 5120, 1, kQ4_1), std::make_pair(1, 2));
  EXPECT_EQ(shape(5120, 17408, 1, kQ4_0), std::make_pair(1, 1));  // down: wide, warps enough
  EXPECT_EQ(shape(6144, 5120, 1, kQ4_0), std::make_pair(2, 1));
  EXPECT_EQ(shape(17408, 17408, 1, kQ4_0), std::make_pair(1, 1));  // tall but wide
  EXPECT_EQ(shape(5120, 17408, 1, kQ8_0), std::make_pair(1, 1));   // 8-bit: chunked rule (1 row)
  EXPECT_EQ(shape(5120, 17408, 8, kQ4_0), std::make_pair(2, 1));  // 8 vectors, 32-element 4-bit: 2 rows
  EXPECT_EQ(shape(17408, 5120, 1, kQ8_0), std::make_pair(1, 1));  // 8-bit: lost there
  EXPECT_EQ(shape(17408, 5120, 8, kQ4_0), std::make_pair(2, 1));
  EXPECT_EQ(shape(17408, 5120, 2, kQ4_0), std::make_pair(2, 1));  // 2 vectors: the chunked rule
  auto q4k = [](int64_t rows, int64_t cols, int n_vec) {
    const mvhost::SplitShape s = mvhost::split_shape(rows, cols, n_vec, 144, 256);
    return std::make_pair(s.rows_per_warp, s.depth);
  };
  EXPECT_EQ(q4k(17408, 5120, 1), std::make_pair(1, 2));  // Q4_K is 4-bit: the same one-vector rules
  EXPECT_EQ(q4k(17408, 5120, 8), std::make_pair(4, 1));  // 8 vectors: 4 rows, but 2 when wide
  EXPECT_EQ(q4k(6144, 5120, 8), std::make_pair(4, 1));
  EXPECT_EQ(q4k(5120, 17408, 8), std::make_pair(2, 1));
  auto q6k = [](int64_t rows, int64_t cols, int n_vec) {
    const mvhost::SplitShape s = mvhost::split_shape(rows, cols, n_vec, 210, 256);
    return std::make_pair(s.rows_per_warp, s.depth);
  };
  EXPECT_EQ(q6k(32000, 5120, 1), std::make_pair(1, 2));  // Q6_K: depth 2 unless wide
  EXPECT_EQ(q6k(6144, 5120, 1), std::make_pair(1, 2));
  EXPECT_EQ(q6k(5120, 17408, 1), std::make_pair(1, 1));
  EXPECT_EQ(q6k(17408, 5120, 8), std::make_pair(2, 1));  // several vectors: the chunked rule
  const int before = mvhost::split_depth();
  mvhost::set_split_depth(2);  // forced: every one-vector launch, rows by the chunked rule
  const auto forced_small = shape(6144, 5120, 1, kQ4_0), forced_tall = shape(17408, 5120, 1, kQ4_0),
             forced_batch = shape(17408, 5120, 8, kQ4_0);
  mvhost::set_split_depth(before);  // nothing between can fail
  EXPECT_EQ(forced_small, std::make_pair(2, 2));
  EXPECT_EQ(forced_tall, std::make_pair(2, 2));
  EXPECT_EQ(forced_batch, std::make_pair(2, 1));
  // A grouped launch over split matrices takes the register kernel's rows.
  std::vector<DeviceMatrix> qkv = {mat(TensorType::Q4_0, 6144, 5120), mat(TensorType::Q4_0, 1024, 5120),
                                   mat(TensorType::Q4_0, 1024, 5120)};
  for (DeviceMatrix& m : qkv) m.layout = WeightLayout::Split;
  EXPECT_EQ(plan(qkv, mvhost::kRowsFourVectors).rows_per_warp, 2);
  for (DeviceMatrix& m : qkv) m.type = TensorType::Q4_K, m.row_bytes = gguf::row_bytes(m.type, 5120);
  EXPECT_EQ(plan(qkv, mvhost::kRowsFourVectors).rows_per_warp, 4);
}

// Which matrices the register kernel reads (BlockMatvecKernel's comment):
// split matrices, whatever kernel is selected; nothing in the GGUF layout.
TEST(RegisterKernel, ReadsSplitMatricesOnly) {
  using K = BlockMatvecKernel;
  for (TensorType t : {TensorType::Q4_0, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K, TensorType::Q8_0,
                       TensorType::F16})
    EXPECT_FALSE(mvhost::reads_registers(mat(t, 256, 512))) << gguf::type_name(t);
  for (TensorType t : {TensorType::Q4_0, TensorType::Q4_K, TensorType::Q6_K, TensorType::Q8_0}) {
    DeviceMatrix m = mat(t, 256, 512);
    m.layout = WeightLayout::Split;
    EXPECT_TRUE(mvhost::reads_registers(m)) << gguf::type_name(t);
  }
  // A group runs it only where it reads every matrix.
  std::vector<DeviceMatrix> both{mat(TensorType::Q4_K, 1024, 512), mat(TensorType::Q4_K, 64, 512)};
  EXPECT_FALSE(plan(both, 1, K::Chunked).registers);
  EXPECT_TRUE(plan(both, 1, K::Chunked).one_launch);
  EXPECT_FALSE(plan(both, 1, K::Tiled).one_launch);  // the tiled kernel: one launch per matrix
  for (DeviceMatrix& m : both) m.layout = WeightLayout::Split;
  for (K k : {K::Chunked, K::Tiled}) {
    EXPECT_TRUE(plan(both, 1, k).registers);
    EXPECT_TRUE(plan(both, 1, k).one_launch);
  }
}

}  // namespace
}  // namespace activekv::cuda
