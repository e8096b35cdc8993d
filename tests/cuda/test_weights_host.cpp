// CPU half of the weight-kernel tests (no GPU needed; runs in CI): the device
// code's block decoders (src/cuda/quant_blocks.cuh, compiled for the host)
// bitwise against gguf::dequantize, its bf16 rounding against core/bf16.h,
// and the lane-by-lane emulation of the matvec (matvec_emulation.h, which
// the GPU test holds the kernel to bitwise) against fp64: this is where the
// matvec's error bounds are measured.
#include <gtest/gtest.h>

#include <cstdio>

#include "activekv/core/bf16.h"
#include "matvec_emulation.h"
#include "matvec_host.h"
#include "mma_matvec.h"
#include "quant_kregs.cuh"
#include "quant_q6kregs.cuh"
#include "quant_split.cuh"

namespace activekv::cuda {
namespace {

using namespace wtest;

/// Every element of every row decoded by the device traits of type T.
template <class T>
std::vector<float> decode_with_traits(const HostMatrix& h) {
  std::vector<float> out(size_t(h.rows * h.cols));
  for (int64_t r = 0; r < h.rows; ++r) {
    const uint8_t* row = h.bytes.data() + r * h.row_bytes;
    float* o = out.data() + r * h.cols;
    if constexpr (T::kPiece == 32) {
      for (int64_t e = 0; e < h.cols; e += 4) {
        const int64_t b = e / T::kElems, in = e % T::kElems;
        qblk::dequant4<T>(row + b * T::kBytes, int(in / 32), int(in % 32 / 4), o + e);
      }
    } else {
      for (int64_t e = 0; e < h.cols; e += 8) T::decode8(row, e, o + e);
    }
  }
  return out;
}

std::vector<float> decode_with_traits(const HostMatrix& h) {
  std::vector<float> out;
  auto go = [&](auto t) { out = decode_with_traits<decltype(t)>(h); };
  if (!qblk::dispatch_block_type(h.type, go)) qblk::dispatch_float_type(h.type, go);
  return out;
}

class WeightKernelsHost : public ::testing::TestWithParam<TensorType> {};

TEST_P(WeightKernelsHost, DeviceDecodersMatchCpuDequantizer) {
  const TensorType t = GetParam();
  // Sane scales, and raw random bytes: inf/NaN scales and float values,
  // subnormals. Block types compute NaNs there (inf * 0, NaN - NaN), whose
  // payload and sign depend on operand order (and the GPU canonicalises
  // them): for those any NaN matches any NaN; float types convert by bit
  // manipulation and must match exactly.
  for (bool raw : {false, true}) {
    const bool nan_is_nan = raw && !is_float_type(t);
    const HostMatrix h = random_matrix(t, 7, 1536, 11 + uint64_t(t), raw);
    const std::vector<float> want = h.dequant(), got = decode_with_traits(h);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      uint32_t g, w;
      std::memcpy(&g, &got[i], 4);
      std::memcpy(&w, &want[i], 4);
      if (nan_is_nan && std::isnan(got[i]) && std::isnan(want[i])) continue;
      ASSERT_EQ(g, w) << gguf::type_name(t) << (raw ? " raw" : "") << " element " << i << ": " << got[i]
                      << " vs " << want[i];
    }
  }
}

TEST_P(WeightKernelsHost, EmulatedMatvecVsFp64) {
  const TensorType t = GetParam();
  const double emul_bound = is_float_type(t) ? kEmulBoundFloat : kEmulBoundQuant;
  for (const BlockMatvecKernel kernel : {BlockMatvecKernel::Tiled, BlockMatvecKernel::Chunked}) {
    if (is_float_type(t) && kernel != BlockMatvecKernel::Tiled) continue;  // one float kernel
    MatvecErrors worst;
    uint64_t seed = 1000 + uint64_t(t);
    for (const Shape& s : shapes_for(t)) {
      const HostMatrix h = random_matrix(t, s.rows, s.cols, seed++);
      const std::vector<float> wd = h.dequant();
      for (int n_vec : {1, 2, 8}) {
        const std::vector<float> x = random_x(n_vec, s.cols, seed++);
        const MatvecErrors e = compare_matvec(h, wd, x, n_vec, emulate_matvec(h, x, n_vec, kernel), emul_bound);
        SCOPED_TRACE(std::string(kernel_name(kernel)) + " " + std::to_string(s.rows) + "x" +
                     std::to_string(s.cols) + " n_vec " + std::to_string(n_vec));
        EXPECT_LE(e.rel_emul, emul_bound);
        if (!is_float_type(t)) {
          EXPECT_LE(e.worst_ratio, kWorstRatioBound);
          EXPECT_LE(e.z, kZBound);
        }
        worst.merge(e);
      }
    }
    std::printf("[measured] %-5s %-7s emulated matvec: rel err vs fp64 with x_hat %.3g (bound %.3g); vs exact x "
                "%.3g of the hard bound (bound %.3g), max z %.3g (bound %.3g)\n",
                gguf::type_name(t).c_str(), kernel_name(kernel), worst.rel_emul, emul_bound, worst.worst_ratio,
                kWorstRatioBound, worst.z, kZBound);
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, WeightKernelsHost, ::testing::ValuesIn(all_types()),
                         [](const auto& info) { return gguf::type_name(info.param); });

TEST(WeightKernelsHostBf16, RoundingMatchesCoreBf16) {
  Rng rng(99);
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
                                0xffbfffffu, 0x00000001u, 0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x3f80ffffu};
  for (int i = 0; i < 1 << 20; ++i) bits.push_back(uint32_t(rng.g()));
  for (uint32_t u : bits) {
    float f;
    std::memcpy(&f, &u, 4);
    ASSERT_EQ(qblk::f32_to_bf16_bits(f), f32_to_bf16(f).bits) << std::hex << "0x" << u;
  }
}

TEST(WeightKernelsHostQuant, ActivationQuantisationIsInRange) {
  // q in [-127, 127], |x - d*q| <= d/2, and an all-zero block gives d = 0.
  const std::vector<float> x = random_x(2, 1024, 5);
  const QuantizedX q = quantize_like_kernel(x, 2, 1024);
  EXPECT_EQ(q.ds[0].x, 0.f);
  for (size_t i = 0; i < x.size(); ++i) {
    const float d = q.ds[i / 32].x;
    ASSERT_LE(std::abs(int(q.qx[i])), 127);
    ASSERT_LE(std::fabs(double(x[i]) - double(d) * q.qx[i]), double(d) / 2 * (1 + 1e-6)) << i;
  }
}

/// h (GGUF layout) repacked into the split layout by quant_split.cuh's
/// offsets, on the host.
template <class T>
std::vector<uint8_t> split_on_host(const HostMatrix& h) {
  using S = qsplit::SplitOf<T>;
  const int64_t n_blocks = h.cols / T::kElems;
  std::vector<uint8_t> split(h.bytes.size());
  for (int64_t r = 0; r < h.rows; ++r)
    for (int64_t b = 0; b < n_blocks; ++b) {
      const uint8_t* g = h.bytes.data() + r * h.row_bytes + b * T::kBytes;
      std::memcpy(split.data() + qsplit::head_offset<T>(h.rows, r, b, n_blocks), g + S::kHeadAt, S::kHead);
      uint8_t* payload = split.data() + qsplit::payload_offset<T>(r, b, n_blocks);
      for (int i = 0; i < S::kPayload; ++i) payload[i] = qsplit::split_payload_byte<T>(g, i);
    }
  return split;
}

// The split layout (quant_split.cuh): a matrix repacked by its offsets, each
// block read through SplitPtr (memory) and, for the 32-element types,
// SplitRegs (registers, what the register matvec holds) decodes and dots bit
// for bit as its GGUF bytes do -- so the register kernel's rows are the
// chunked kernel's (the GPU test checks the kernels themselves, and the GPU
// repack against these offsets). Q6_K's registers: Q6kRegistersHost below.
TEST(SplitLayoutHost, SourcesReadTheGgufBytes) {
  int checked = 0;
  for (const TensorType t : all_types()) {
    qblk::dispatch_block_type(t, [&](auto traits) {
      using T = decltype(traits);
      if constexpr (qsplit::SplitOf<T>::kOk) {
        SCOPED_TRACE(gguf::type_name(t));
        const HostMatrix h = random_matrix(t, 5, 512, 515 + uint64_t(t));
        const int64_t n_blocks = h.cols / T::kElems;
        const std::vector<uint8_t> split = split_on_host<T>(h);
        const std::vector<float> x = random_x(2, h.cols, 99);
        const QuantizedX q = quantize_like_kernel(x, 2, h.cols);
        const qdot::XQuant xq = q.view();
        for (int64_t r = 0; r < h.rows; ++r)
          for (int64_t b = 0; b < n_blocks; ++b) {
            const uint8_t* g = h.bytes.data() + r * h.row_bytes + b * T::kBytes;
            const qsplit::SplitPtr<T> sp = qsplit::split_block<T>(split.data(), h.rows, r, b, n_blocks);
            for (int u = 0; u < T::kUnits; ++u)
              for (int q = 0; q < 8; ++q) {
                float want[4], via_ptr[4];
                qblk::dequant4<T>(g, u, q, want);
                qblk::dequant4<T>(sp, u, q, via_ptr);
                ASSERT_EQ(0, std::memcmp(want, via_ptr, sizeof want))
                    << "SplitPtr, row " << r << " block " << b << " unit " << u;
              }
            uint8_t back[T::kBytes];  // the GGUF block again, from the split one
            qsplit::gguf_block(sp, back);
            ASSERT_EQ(0, std::memcmp(back, g, T::kBytes)) << "gguf_block, row " << r << " block " << b;
            if constexpr (std::is_same_v<T, qblk::Q4_K>) {  // its dot: through SplitPtr
              for (int u = 0; u < 8; ++u) {
                qdot::UnitX<2> ux;
                qdot::load_unit_x<2>(b * T::kUnits + u, xq, h.cols, ux);
                float want[2] = {0.5f, -0.25f}, got[2] = {0.5f, -0.25f};
                qdot::dot_unit_x<T, 2>(g, u, ux, want);
                qdot::dot_unit_x<T, 2>(sp, u, ux, got);
                ASSERT_EQ(0, std::memcmp(want, got, sizeof want)) << "dot, row " << r << " block " << b;
              }
            } else if constexpr (T::kUnits == 8) {  // Q6_K: its items through SplitPtr
              for (int item = 0; item < 8; ++item) {
                qdot::Q6kX<2> qx;
                qdot::load_q6k_x<2>(item >> 2, item & 3, b * T::kUnits, xq, h.cols, qx);
                float want[2] = {0.5f, -0.25f}, got[2] = {0.5f, -0.25f};
                qdot::dot_q6k_item_x<2>(g, item >> 2, item & 3, qx, want);
                qdot::dot_q6k_item_x<2>(sp, item >> 2, item & 3, qx, got);
                ASSERT_EQ(0, std::memcmp(want, got, sizeof want)) << "dot, row " << r << " block " << b;
              }
            } else {
              qsplit::SplitRegs<T> regs;
              qsplit::load_regs_host(sp, regs);
              for (int q = 0; q < 8; ++q) {
                float want[4], via_regs[4];
                qblk::dequant4<T>(g, 0, q, want);
                qblk::dequant4<T>(regs, 0, q, via_regs);
                ASSERT_EQ(0, std::memcmp(want, via_regs, sizeof want)) << "SplitRegs, row " << r << " block " << b;
              }
              qdot::UnitX<2> ux;
              qdot::load_unit_x<2>(b, xq, h.cols, ux);
              float want[2] = {0.5f, -0.25f}, got[2] = {0.5f, -0.25f};
              qdot::dot_unit_x<T, 2>(g, 0, ux, want);
              qdot::dot_unit_x<T, 2>(regs, 0, ux, got);
              ASSERT_EQ(0, std::memcmp(want, got, sizeof want)) << "dot, row " << r << " block " << b;
            }
          }
        ++checked;
      }
    });
  }
  EXPECT_EQ(checked, 6);  // Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K
}

// Q6_K in registers (quant_q6kregs.cuh): an item (h, j) loaded from the split
// layout as the register matvec loads it -- four 8-byte words and d --
// decodes its 8 columns of 4 units and dots bit for bit as the block's GGUF
// bytes do, for every item of every block, with h and j known only at run
// time (as in the kernel, where they are the lane's). So the register
// kernel's Q6_K rows are the chunked kernel's (the GPU test checks the
// kernel itself).
TEST(Q6kRegistersHost, ItemRegsReadTheGgufBytes) {
  using qblk::Q6_K;
  const HostMatrix h = random_matrix(TensorType::Q6_K, 3, 1024, 717);
  const int64_t n_blocks = h.cols / Q6_K::kElems;
  const std::vector<uint8_t> split = split_on_host<Q6_K>(h);
  const std::vector<float> x = random_x(3, h.cols, 97);
  const QuantizedX q = quantize_like_kernel(x, 3, h.cols);
  const qdot::XQuant xq = q.view();
  volatile int item_at_run_time = 0;
  int checked = 0;
  for (int64_t r = 0; r < h.rows; ++r)
    for (int64_t b = 0; b < n_blocks; ++b)
      for (int i0 = 0; i0 < 8; ++i0) {
        item_at_run_time = i0;
        const int hh = item_at_run_time >> 2, j = item_at_run_time & 3;
        const uint8_t* g = h.bytes.data() + r * h.row_bytes + b * Q6_K::kBytes;
        qsplit::Q6kItemRegs regs;
        qsplit::load_q6k_item_host(qsplit::split_block<Q6_K>(split.data(), h.rows, r, b, n_blocks), hh, j, regs);
        for (int k = 0; k < 4; ++k)
          for (int gi = 2 * j; gi < 2 * j + 2; ++gi) {
            float want[4], got[4];
            qblk::dequant4<Q6_K>(g, 4 * hh + k, gi, want);
            qblk::dequant4<Q6_K>(regs, 4 * hh + k, gi, got);
            ASSERT_EQ(0, std::memcmp(want, got, sizeof want)) << "row " << r << " block " << b << " item " << i0;
          }
        qdot::Q6kX<3> qx;
        qdot::load_q6k_x<3>(hh, j, b * Q6_K::kUnits, xq, h.cols, qx);
        float want[3] = {0.5f, -0.25f, 2.f}, got[3] = {0.5f, -0.25f, 2.f};
        qdot::dot_q6k_item_x<3>(g, hh, j, qx, want);
        qdot::dot_q6k_item_x<3>(regs, hh, j, qx, got);
        ASSERT_EQ(0, std::memcmp(want, got, sizeof want)) << "dot, row " << r << " block " << b << " item " << i0;
        ++checked;
      }
  EXPECT_EQ(checked, 3 * 4 * 8);
}

// dot_q6k_item_x with one vector takes the codes' offset of 32 as a dot of
// x with bytes of -32 instead of subtracting it from every code byte
// (kOffsetByDot): the same int32, so the same bits as vector 0 of a
// several-vector dot, which subtracts. Random blocks, then the extremes:
// every code 0 or 63 against x of -127 or 127.
TEST(Q6kRegistersHost, OneVectorDotIsBitwiseVectorZeroOfSeveral) {
  using qblk::Q6_K;
  auto check = [](const uint8_t* g, const qdot::Q6kX<3>& qx, int hh, int j) {
    qdot::Q6kX<1> one;
    for (int k = 0; k < 4; ++k) one.xs[0][k] = qx.xs[0][k], one.d[0][k] = qx.d[0][k];
    float several[3] = {0.5f, -0.25f, 2.f}, single[1] = {0.5f};
    qdot::dot_q6k_item_x<3>(g, hh, j, qx, several);
    qdot::dot_q6k_item_x<1>(g, hh, j, one, single);
    return std::memcmp(&several[0], &single[0], sizeof(float)) == 0;
  };
  const HostMatrix h = random_matrix(TensorType::Q6_K, 2, 1024, 733);
  const std::vector<float> x = random_x(3, h.cols, 31);
  const QuantizedX q = quantize_like_kernel(x, 3, h.cols);
  int checked = 0;
  for (int64_t r = 0; r < h.rows; ++r)
    for (int64_t b = 0; b < h.cols / Q6_K::kElems; ++b)
      for (int item = 0; item < 8; ++item) {
        qdot::Q6kX<3> qx;
        qdot::load_q6k_x<3>(item >> 2, item & 3, b * Q6_K::kUnits, q.view(), h.cols, qx);
        ASSERT_TRUE(check(h.bytes.data() + r * h.row_bytes + b * Q6_K::kBytes, qx, item >> 2, item & 3))
            << "row " << r << " block " << b << " item " << item;
        ++checked;
      }
  for (const uint8_t fill : {uint8_t(0x00), uint8_t(0xff)})  // codes all 0, all 63
    for (const int8_t xv : {int8_t(-127), int8_t(127)}) {
      uint8_t blk[Q6_K::kBytes];
      std::memset(blk, fill, 192);
      std::memset(blk + 192, 0x7f, 16);  // scales +127
      blk[208] = 0x00, blk[209] = 0x3c;  // d = 1.0
      qdot::Q6kX<3> qx;
      for (int v = 0; v < 3; ++v)
        for (int k = 0; k < 4; ++k) {
          const uint32_t w = 0x01010101u * uint8_t(xv);
          qx.xs[v][k] = {int(w), int(w)};
          qx.d[v][k] = 0.75f;
        }
      for (int item = 0; item < 8; ++item) {
        ASSERT_TRUE(check(blk, qx, item >> 2, item & 3)) << "fill " << int(fill) << " x " << int(xv);
        ++checked;
      }
    }
  EXPECT_EQ(checked, 2 * 4 * 8 + 4 * 8);
}

// Q4_K in registers (quant_kregs.cuh): a unit of a split block loaded as the
// register matvec loads it -- the super-block's head and the unit's 16
// payload bytes -- has the 6-bit scale and min scale_min_k4 reads from the
// GGUF bytes, and dots bit for bit as the GGUF bytes do, for every unit of
// every block, with the unit known only at run time (as in the kernel,
// where it is the lane's). Random blocks, then every value of the 12 scale
// bytes' high bits: each byte 0x00, 0x3f, 0xc0 or 0xff in turn. So the
// register kernel's Q4_K rows are the chunked kernel's (the GPU test checks
// the kernel itself).
TEST(Q4kRegistersHost, SplitUnitRegsDotAsTheGgufBytes) {
  using qblk::Q4_K;
  const std::vector<float> x = random_x(3, 1024, 98);
  const QuantizedX q = quantize_like_kernel(x, 3, 1024);
  volatile int unit_at_run_time = 0;
  int checked = 0;
  auto check_block = [&](const uint8_t* g, int64_t b) {
    uint8_t head[16], payload[128];
    std::memcpy(head, g, 16);
    for (int i = 0; i < 128; ++i) payload[i] = qsplit::split_payload_byte<Q4_K>(g, i);
    for (int u0 = 0; u0 < Q4_K::kUnits; ++u0) {
      unit_at_run_time = u0;
      const int u = unit_at_run_time;
      qkregs::UnitRegs regs;
      qkregs::load_unit_host(qkregs::unit_at({head, payload}, u), regs);
      int sc_want, m_want, sc, m;
      qblk::scale_min_k4(g, 4, u, sc_want, m_want);
      qkregs::scale_min(regs, u, sc, m);
      EXPECT_EQ(sc, sc_want) << "unit " << u;
      EXPECT_EQ(m, m_want) << "unit " << u;
      qdot::UnitX<3> ux;
      qdot::load_unit_x<3>(b * Q4_K::kUnits + u, q.view(), 1024, ux);
      float want[3] = {0.5f, -0.25f, 2.f}, got[3] = {0.5f, -0.25f, 2.f};
      qdot::dot_unit_x<Q4_K, 3>(g, u, ux, want);
      qkregs::dot_unit_x<3>(regs, u, ux, got);
      EXPECT_EQ(0, std::memcmp(want, got, sizeof want)) << "dot, block " << b << " unit " << u;
      ++checked;
    }
  };
  const HostMatrix h = random_matrix(TensorType::Q4_K, 3, 1024, 616);
  for (int64_t r = 0; r < h.rows; ++r)
    for (int64_t b = 0; b < h.cols / Q4_K::kElems; ++b) check_block(h.bytes.data() + r * h.row_bytes + b * 144, b);
  uint8_t blk[Q4_K::kBytes];
  std::memcpy(blk, h.bytes.data(), sizeof blk);
  for (int k = 0; k < 12; ++k)
    for (const uint8_t v : {uint8_t(0x00), uint8_t(0x3f), uint8_t(0xc0), uint8_t(0xff)}) {
      uint8_t edge[Q4_K::kBytes];
      std::memcpy(edge, blk, sizeof edge);
      edge[4 + k] = v;
      check_block(edge, 0);
    }
  EXPECT_EQ(checked, 3 * 4 * 8 + 12 * 4 * 8);
}

// Which matrices the mma matvec takes, and its ring depth, are host decisions
// (mmamv::reads, ring_stages): checked here without a GPU. The widths are
// those a review (session 23) found untested on the GPU: Q4_1 at a multiple
// of 4 blocks but not 8 (its 4-byte heads make whole 16-byte pieces), the
// widest row (8192 columns, whole pieces only), and the 4-stage ring the
// 4-bit types reach only there. sm_90's opt-in shared memory a CTA: 232448.
TEST(MmaMatvecHost, TilesItTakesAndTheirRing) {
  using gguf::TensorType;
  const auto matrix = [](TensorType t, int64_t cols) {
    DeviceMatrix w;
    w.type = t;
    w.rows = 45;
    w.cols = cols;
    w.layout = WeightLayout::Split;
    return w;
  };
  const mvhost::MmaMatvec before = mvhost::mma_matvec();
  mvhost::set_mma_matvec(mvhost::MmaMatvec::On);
  EXPECT_TRUE(mmamv::reads(matrix(TensorType::Q4_1, 640), 2)) << "20 blocks of 4-byte heads: 5 pieces";
  EXPECT_FALSE(mmamv::reads(matrix(TensorType::Q4_0, 640), 2)) << "20 blocks of 2-byte heads: 2.5 pieces";
  EXPECT_FALSE(mmamv::reads(matrix(TensorType::Q8_0, 640), 2));
  for (TensorType t : {TensorType::Q4_0, TensorType::Q4_1, TensorType::Q8_0}) {
    EXPECT_TRUE(mmamv::reads(matrix(t, 8192), 8)) << gguf::type_name(t) << ": 256 blocks, the most a row";
    EXPECT_FALSE(mmamv::reads(matrix(t, 8192 + 256), 8)) << gguf::type_name(t) << ": past 256 blocks";
    EXPECT_FALSE(mmamv::reads(matrix(t, 8192), 1)) << "one vector stays on the register kernel";
    EXPECT_GE(mmamv::ring_stages(matrix(t, 8192), 8, 232448), 4) << gguf::type_name(t) << ": fits the H100/H200";
  }
  EXPECT_EQ(mmamv::ring_stages(matrix(TensorType::Q4_0, 8192), 8, 232448), 4) << "x takes the room of 4 pieces";
  EXPECT_EQ(mmamv::ring_stages(matrix(TensorType::Q4_0, 5120), 8, 232448), 8);
  EXPECT_EQ(mmamv::ring_stages(matrix(TensorType::Q4_0, 8192), 8, 48 * 1024), 0) << "too little: run declines";
  mvhost::set_mma_matvec(before);
}

}  // namespace
}  // namespace activekv::cuda
