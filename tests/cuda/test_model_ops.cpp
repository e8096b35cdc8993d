// GPU tests: the model's elementwise/row kernels (activekv/cuda/model_ops.h)
// against the CPU reference (src/model/ops.cpp) or, where the CPU has none
// yet (GeGLU, bias, scale), a CPU evaluation of the definition; plus argument
// errors. Labelled `gpu`.
//
// Bounds come from an error analysis (the ops were written without a GPU at
// hand); each test prints what it measured so the bounds can be tightened to
// ~3x the measurement after the first GPU run. Outputs are poisoned (NaN)
// before every run, every input is fresh random data, every op runs on a
// non-default stream, both the float4 and the scalar paths are exercised.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <tuple>
#include <vector>

#include "activekv/core/bf16.h"
#include "activekv/core/error.h"
#include "activekv/cuda/kv_write.h"
#include "activekv/cuda/model_ops.h"
#include "activekv/cuda/quant_matvec.h"
#include "activekv/model/ops.h"
#include "device_array.h"

namespace activekv::cuda {
namespace {

using testing::DeviceArray;
using testing::Stream;

// Distance in representable floats (0 for -0 vs +0; huge for NaN vs number).
int64_t ulp_diff(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b) ? 0 : INT64_MAX;
  auto ord = [](float f) {
    const int32_t i = std::bit_cast<int32_t>(f);
    return i < 0 ? int64_t(INT32_MIN) - i : int64_t(i);
  };
  return std::llabs(ord(a) - ord(b));
}

struct Diff {
  int64_t max_ulp = 0;
  size_t differ = 0;  // elements not bitwise equal
  size_t n = 0;
  void print(const char* what) const {
    std::printf("[measured] %s: %zu of %zu elements differ from the CPU, max %lld ulp\n", what, differ, n,
                static_cast<long long>(max_ulp));
  }
};

Diff compare(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  Diff d;
  d.n = gpu.size();
  for (size_t i = 0; i < gpu.size(); ++i) {
    const int64_t u = ulp_diff(gpu[i], cpu[i]);
    if (std::bit_cast<uint32_t>(gpu[i]) != std::bit_cast<uint32_t>(cpu[i])) d.differ++;
    d.max_ulp = std::max(d.max_ulp, u);
  }
  return d;
}

// Normal values with a per-row magnitude spread of 10^-3..10^3 (activations
// of real layers vary like that).
std::vector<float> random_rows(int T, int n, std::mt19937_64& rng) {
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> mag(-3.f, 3.f);
  std::vector<float> v(size_t(T) * n);
  for (int t = 0; t < T; ++t) {
    const float m = std::pow(10.f, mag(rng));
    for (int i = 0; i < n; ++i) v[size_t(t) * n + i] = nd(rng) * m;
  }
  return v;
}

std::vector<float> random_uniform(size_t n, float lo, float hi, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// ---------------------------------------------------------------------------
// RMSNorm. The only difference to the CPU is the order of the double sum of
// squares (each square is exact in double): relative ~1e-15, so inv_t rounds
// to the same fp32 unless the double lies within that of an fp32 rounding
// boundary -- probability ~1e-8 per row. Then every element is bitwise equal;
// a row whose inv_t moved by 1 ulp is off by at most 2^-21 relative (4 ulp).
// Asserted: max 4 ulp, at most one row not bitwise equal.

struct NormCase {
  int T, n;
  int offset;  // elements: 1 misaligns every pointer (scalar path)
  bool in_place;
};

class RmsNorm : public ::testing::TestWithParam<NormCase> {};

TEST_P(RmsNorm, MatchesCpu) {
  AKV_NEED_GPU();
  const NormCase c = GetParam();
  std::mt19937_64 rng(1000 + c.T * 7 + c.n);
  const std::vector<float> x = random_rows(c.T, c.n, rng);
  std::vector<float> w = random_rows(1, c.n, rng);
  for (auto& v : w) v = 1.f + 0.1f * v / (std::abs(v) + 1.f);  // around 1, as trained norms
  const float eps = 1e-5f;
  std::vector<float> want(x.size());
  model::rms_norm(x.data(), w.data(), c.T, c.n, eps, want.data());

  const size_t off = size_t(c.offset);
  std::vector<float> xp(off, 0.f), wp(off, 0.f);
  xp.insert(xp.end(), x.begin(), x.end());
  wp.insert(wp.end(), w.begin(), w.end());
  DeviceArray<float> dx(xp), dw(wp), dout(xp.size());
  dout.poison();
  Stream s;
  float* out = c.in_place ? dx.get() + off : dout.get() + off;
  rms_norm(dx.get() + off, dw.get() + off, c.T, c.n, eps, out, s.get());
  s.sync();
  std::vector<float> got = (c.in_place ? dx : dout).download();
  got.erase(got.begin(), got.begin() + std::ptrdiff_t(off));

  const Diff d = compare(got, want);
  d.print("rms_norm");
  EXPECT_LE(d.max_ulp, 4);
  size_t rows_differ = 0;
  for (int t = 0; t < c.T; ++t) {
    for (int i = 0; i < c.n; ++i) {
      const size_t k = size_t(t) * c.n + i;
      if (std::bit_cast<uint32_t>(got[k]) != std::bit_cast<uint32_t>(want[k])) {
        rows_differ++;
        break;
      }
    }
  }
  EXPECT_LE(rows_differ, 1u) << "rows not bitwise equal to the CPU";
}

INSTANTIATE_TEST_SUITE_P(Shapes, RmsNorm,
                         ::testing::Values(NormCase{1, 576, 0, false},     // SmolLM2-135M decode
                                           NormCase{64, 576, 0, true},     // prefill, in place
                                           NormCase{17, 4096, 0, false},   // 7B width
                                           NormCase{1, 5120, 0, false},    // the 27B shape, decode
                                           NormCase{3, 8192, 0, true},     // 70B width
                                           NormCase{33, 1000, 1, false},   // misaligned: scalar path
                                           NormCase{9, 4099, 0, true}));   // n % 4 != 0: scalar path

// ---------------------------------------------------------------------------
// RMSNorm fused with the matvec's int8 quantisation of its output
// (launch_rms_norm_quantize) against the two launches it replaces, rms_norm
// then launch_quantize_activations: the same arithmetic, so bitwise -- the
// normalised rows and every workspace byte (both poisoned alike first).

struct NormQuantCase {
  int T, n;
  int offset;  // elements: 1 misaligns x and out (the two-launch fallback)
  bool in_place;
};

class RmsNormQuantize : public ::testing::TestWithParam<NormQuantCase> {};

TEST_P(RmsNormQuantize, BitwiseTheUnfusedPath) {
  AKV_NEED_GPU();
  const NormQuantCase c = GetParam();
  std::mt19937_64 rng(7000 + c.T * 13 + c.n);
  std::vector<float> x = random_rows(c.T, c.n, rng);
  for (int i = 0; i < 32 && i < c.n; ++i) x[size_t(i)] = 0.f;  // an all-zero block: amax 0
  std::vector<float> w = random_rows(1, c.n, rng);
  for (auto& v : w) v = 1.f + 0.1f * v / (std::abs(v) + 1.f);
  const float eps = 1e-6f;
  const size_t off = size_t(c.offset);
  std::vector<float> xp(off, 0.f);
  xp.insert(xp.end(), x.begin(), x.end());
  const size_t ws_bytes = matvec_workspace_bytes(c.n, c.T);
  Stream s;

  // Unfused: rms_norm into out, then quantise out.
  DeviceArray<float> dw(w), dx_ref(xp), dout_ref(xp.size());
  DeviceArray<uint8_t> ws_ref(ws_bytes);
  dout_ref.poison();
  ws_ref.poison();
  float* out_ref = c.in_place ? dx_ref.get() + off : dout_ref.get() + off;
  rms_norm(dx_ref.get() + off, dw.get(), c.T, c.n, eps, out_ref, s.get());
  launch_quantize_activations(out_ref, c.n, c.T, ws_ref.get(), s.get());

  // Fused.
  DeviceArray<float> dx(xp), dout(xp.size());
  DeviceArray<uint8_t> ws(ws_bytes);
  dout.poison();
  ws.poison();
  float* out = c.in_place ? dx.get() + off : dout.get() + off;
  launch_rms_norm_quantize(dx.get() + off, dw.get(), c.T, c.n, eps, out, ws.get(), s.get());
  s.sync();

  const std::vector<float> got = (c.in_place ? dx : dout).download(), want = (c.in_place ? dx_ref : dout_ref).download();
  EXPECT_EQ(compare(got, want).differ, 0u) << "normalised rows";
  const std::vector<uint8_t> wsg = ws.download(), wsw = ws_ref.download();
  size_t bytes_differ = 0;
  for (size_t i = 0; i < wsg.size(); ++i) bytes_differ += wsg[i] != wsw[i];
  EXPECT_EQ(bytes_differ, 0u) << "workspace bytes (int8 x and its {d, sum q})";
  // The workspace was written at all: the first block (all zero) has d = 0, the second a positive d.
  EXPECT_NE(wsg, std::vector<uint8_t>(wsg.size(), 0xff));
}

INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormQuantize,
                         ::testing::Values(NormQuantCase{1, 5120, 0, false},  // the 27B shape, decode
                                           NormQuantCase{8, 5120, 0, true},   // batch of 8, in place
                                           NormQuantCase{1, 576, 0, false},   // SmolLM2-135M
                                           NormQuantCase{3, 896, 0, true},    // Qwen2-0.5B
                                           NormQuantCase{5, 640, 1, false},   // misaligned: two launches
                                           NormQuantCase{2, 17408, 0, false}));

TEST(RmsNormQuantizeErrors, BadArgumentsThrow) {
  AKV_NEED_GPU();
  Stream s;
  DeviceArray<float> a(1024);
  DeviceArray<uint8_t> ws(matvec_workspace_bytes(512, 8));
  EXPECT_THROW(launch_rms_norm_quantize(a.get(), a.get(), 1, 100, 1e-5f, a.get(), ws.get(), s.get()),
               InvalidArgument);  // n not a multiple of 32
  EXPECT_THROW(launch_rms_norm_quantize(a.get(), a.get(), 9, 64, 1e-5f, a.get(), ws.get(), s.get()),
               InvalidArgument);  // more rows than a matvec takes
  EXPECT_THROW(launch_rms_norm_quantize(a.get(), a.get(), 1, 64, 1e-5f, a.get(), ws.get() + 1, s.get()),
               InvalidArgument);  // workspace not 256-byte aligned
  EXPECT_THROW(launch_rms_norm_quantize(a.get(), a.get(), 1, 64, -1.f, a.get(), ws.get(), s.get()),
               InvalidArgument);  // eps
}

// ---------------------------------------------------------------------------
// RoPE. The frequencies are the CPU's own doubles (RopeFreqs computes them on
// the host), the angle is the same double product; cos/sin are CUDA's double
// functions (<= 2 ulp) vs glibc's (< 1 ulp), so their fp32 roundings differ
// with probability ~4e-16 * 2^24 ~ 1e-8 per value; the rotation itself is the
// CPU's fp32 arithmetic. Asserted: at most 1e-4 of the values differ (1e4x
// the estimate, but any systematic fault differs in most), and each within
// what one flipped cos/sin explains: |d| <= 2^-21 (|x0| + |x1|).

struct RopeCase {
  int T, n_heads, head_dim, rope_dim;
  float base;
  model::RopeLayout layout;
};

class Rope : public ::testing::TestWithParam<RopeCase> {};

TEST_P(Rope, MatchesCpu) {
  AKV_NEED_GPU();
  const RopeCase c = GetParam();
  std::mt19937_64 rng(2000 + c.T + c.head_dim + c.rope_dim);
  const std::vector<float> x = random_rows(c.T, c.n_heads * c.head_dim, rng);
  std::vector<int64_t> pos(size_t(c.T));
  std::uniform_int_distribution<int64_t> far(0, 1'000'000);
  for (int t = 0; t < c.T; ++t)  // up to 1M, small, near 128K
    pos[size_t(t)] = t % 3 == 0 ? far(rng) : t % 3 == 1 ? t : 131071 - t;

  model::ModelConfig cfg;
  cfg.rope_dim = c.rope_dim;
  cfg.rope_base = c.base;
  cfg.rope_layout = c.layout;
  std::vector<float> want = x;
  model::rope(want.data(), c.T, c.n_heads, c.head_dim, pos.data(), cfg, cfg.rope_base);

  const RopeFreqs freqs(cfg);
  DeviceArray<float> dx(x);
  DeviceArray<int64_t> dpos(pos);
  Stream s;
  rope(dx.get(), c.T, c.n_heads, c.head_dim, dpos.get(), freqs, s.get());
  s.sync();
  const std::vector<float> got = dx.download();

  const Diff d = compare(got, want);
  d.print("rope");
  EXPECT_LE(double(d.differ), 1e-4 * double(d.n));
  const int half = c.rope_dim / 2;
  size_t beyond = 0;
  for (int t = 0; t < c.T; ++t) {
    for (int h = 0; h < c.n_heads; ++h) {
      const size_t row = (size_t(t) * c.n_heads + h) * c.head_dim;
      for (int i = 0; i < half; ++i) {
        const int a = c.layout == model::RopeLayout::Interleaved ? 2 * i : i;
        const int b = c.layout == model::RopeLayout::Interleaved ? 2 * i + 1 : i + half;
        const double bound = std::ldexp(std::abs(x[row + a]) + std::abs(x[row + b]), -21);
        if (std::abs(double(got[row + a]) - want[row + a]) > bound) beyond++;
        if (std::abs(double(got[row + b]) - want[row + b]) > bound) beyond++;
      }
      for (int i = c.rope_dim; i < c.head_dim; ++i)  // not rotated: untouched
        ASSERT_EQ(std::bit_cast<uint32_t>(got[row + i]), std::bit_cast<uint32_t>(x[row + i])) << "channel " << i;
    }
  }
  EXPECT_EQ(beyond, 0u) << "values beyond one flipped cos/sin";
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, Rope,
    ::testing::Values(RopeCase{64, 9, 64, 64, 10000.f, model::RopeLayout::Interleaved},     // SmolLM2-135M q
                      RopeCase{1, 3, 64, 64, 100000.f, model::RopeLayout::Interleaved},     // decode, k
                      RopeCase{48, 14, 64, 64, 1000000.f, model::RopeLayout::HalfSplit},    // Qwen2-0.5B
                      RopeCase{32, 4, 128, 128, 500000.f, model::RopeLayout::HalfSplit},    // NeoX, hd 128
                      RopeCase{16, 2, 128, 64, 10000.f, model::RopeLayout::Interleaved},    // partial rotary
                      RopeCase{16, 2, 256, 128, 10000.f, model::RopeLayout::HalfSplit}));   // partial, hd 256

// ---------------------------------------------------------------------------
// SwiGLU. CUDA's exp in double rounded to fp32 is the correctly rounded expf;
// glibc's expf is not always (error <= 0.502 ulp): simulated on the CPU with
// these inputs (g uniform in [-20, 20]), 2.5e-4 of the elements differ, by at
// most 6 ulp (a 1-ulp change of e = exp(-g) moves 1 + e, the quotient and the
// product by up to 2^-21 relative). Asserted: at most 1e-3 differ, <= 8 ulp.

TEST(SwiGLU, MatchesCpu) {
  AKV_NEED_GPU();
  for (const int64_t n : {int64_t(1536), int64_t(1001), int64_t(3) * 14336}) {
    std::mt19937_64 rng(3000 + n);
    const std::vector<float> gate = random_uniform(size_t(n), -20.f, 20.f, rng);
    const std::vector<float> up = random_rows(1, int(n), rng);
    std::vector<float> want = gate;
    model::swiglu(want.data(), up.data(), 1, int(n));
    DeviceArray<float> dg(gate), du(up);
    Stream s;
    swiglu(dg.get(), du.get(), n, s.get());
    s.sync();
    const Diff d = compare(dg.download(), want);
    d.print("swiglu");
    EXPECT_LE(d.max_ulp, 8) << "n " << n;
    EXPECT_LE(double(d.differ), 1e-3 * double(n) + 1) << "n " << n;
  }
}

// rope_qk: q and k in one launch, bitwise two rope calls (the same per-pair
// arithmetic in the same thread).
TEST(RopeQK, BitwiseTwoRopes) {
  AKV_NEED_GPU();
  for (const auto layout : {model::RopeLayout::Interleaved, model::RopeLayout::HalfSplit}) {
    const int T = 5, nq = 24, nk = 4, hd = 256;  // the 27B shape's heads
    std::mt19937_64 rng(8000 + int(layout));
    const std::vector<float> q = random_rows(T, nq * hd, rng), k = random_rows(T, nk * hd, rng);
    const std::vector<int64_t> pos = {0, 1, 4097, 131071, 999999};
    const RopeFreqs freqs(hd, 1000000.f, layout);
    DeviceArray<float> dq(q), dk(k), dq2(q), dk2(k);
    DeviceArray<int64_t> dpos(pos);
    Stream s;
    rope(dq.get(), T, nq, hd, dpos.get(), freqs, s.get());
    rope(dk.get(), T, nk, hd, dpos.get(), freqs, s.get());
    rope_qk(dq2.get(), nq, dk2.get(), nk, T, hd, dpos.get(), freqs, s.get());
    s.sync();
    EXPECT_EQ(compare(dq2.download(), dq.download()).differ, 0u) << "q";
    EXPECT_EQ(compare(dk2.download(), dk.download()).differ, 0u) << "k";
    EXPECT_NE(compare(dk2.download(), k).differ, 0u) << "k was rotated at all";
  }
}

// launch_swiglu_quantize: swiglu and the matvec's int8 quantisation of its
// output in one kernel, bitwise the two launches it replaces (gate and every
// workspace byte).
TEST(SwiGLUQuantize, BitwiseTheUnfusedPath) {
  AKV_NEED_GPU();
  for (const auto& [T, n, off] : {std::tuple{1, 17408, 0}, std::tuple{8, 1536, 0}, std::tuple{3, 4864, 1}}) {
    std::mt19937_64 rng(9000 + T + n);
    const std::vector<float> gate = random_uniform(size_t(T) * n + 1, -20.f, 20.f, rng);
    const std::vector<float> up = random_rows(1, T * n + 1, rng);
    const size_t ws_bytes = matvec_workspace_bytes(n, T);
    DeviceArray<float> dg(gate), du(up), dg2(gate);
    DeviceArray<uint8_t> ws(ws_bytes), ws2(ws_bytes);
    ws.poison();
    ws2.poison();
    Stream s;
    swiglu(dg.get() + off, du.get() + off, int64_t(T) * n, s.get());
    launch_quantize_activations(dg.get() + off, n, T, ws.get(), s.get());
    launch_swiglu_quantize(dg2.get() + off, du.get() + off, T, n, ws2.get(), s.get());  // off 1: two launches
    s.sync();
    EXPECT_EQ(compare(dg2.download(), dg.download()).differ, 0u) << "gate, n " << n;
    EXPECT_EQ(ws2.download(), ws.download()) << "workspace, n " << n;
  }
  Stream s;
  DeviceArray<float> a(64);
  DeviceArray<uint8_t> ws(matvec_workspace_bytes(64, 1));
  EXPECT_THROW(launch_swiglu_quantize(a.get(), a.get(), 1, 48, ws.get(), s.get()), InvalidArgument);
  EXPECT_THROW(launch_swiglu_quantize(a.get(), nullptr, 1, 64, ws.get(), s.get()), InvalidArgument);
}

// ---------------------------------------------------------------------------
// GeGLU (no CPU op yet): the definition 0.5 g (1 + tanh(sqrt(2/pi) (g +
// 0.044715 g^3))) in long double, rounded to fp32, times up in fp32. The GPU's
// double evaluation of the same function rounds to the same fp32 but with
// probability ~1e-8 (measured on the CPU: double vs long double tanh, 0 of
// 10^7 differ after rounding to fp32); g in [-6, 6] keeps 1 + tanh clear of
// cancellation in the reference. Asserted: <= 2 ulp, at most 1e-4 differ; and
// the tails: gelu(g) = g for large g, -0/tiny for very negative g.

float gelu_ref(float g) {
  const long double x = g;
  const long double z = 0.79788456080286535587989211986876L * (x + 0.044715L * x * x * x);
  return float(0.5L * x * (1.0L + std::tanh(z)));
}

TEST(GeGLUTanh, MatchesDefinition) {
  AKV_NEED_GPU();
  for (const int64_t n : {int64_t(10240), int64_t(1003)}) {
    std::mt19937_64 rng(4000 + n);
    std::vector<float> gate = random_uniform(size_t(n), -6.f, 6.f, rng);
    gate[0] = 40.f, gate[1] = -40.f, gate[2] = 0.f, gate[3] = -0.f;
    const std::vector<float> up = random_rows(1, int(n), rng);
    std::vector<float> want(static_cast<size_t>(n));
    for (size_t i = 0; i < want.size(); ++i) want[i] = gelu_ref(gate[i]) * up[i];
    DeviceArray<float> dg(gate), du(up);
    Stream s;
    geglu_tanh(dg.get(), du.get(), n, s.get());
    s.sync();
    const std::vector<float> got = dg.download();
    const Diff d = compare(got, want);
    d.print("geglu_tanh");
    EXPECT_LE(d.max_ulp, 2) << "n " << n;
    EXPECT_LE(double(d.differ), 1e-4 * double(n) + 1) << "n " << n;
    EXPECT_EQ(got[0], 40.f * up[0]);
    EXPECT_EQ(got[1], 0.f);  // -40 * ~e^-1500: zero of either sign
  }
}

// ---------------------------------------------------------------------------
// add, add_bias, scale: one fp32 operation per element, the same on both
// sides: bitwise.

TEST(Residual, AddBiasScaleAreBitwise) {
  AKV_NEED_GPU();
  std::mt19937_64 rng(5000);
  Stream s;
  for (const int n : {896, 130, 4096}) {  // Qwen2-0.5B width, n % 4 != 0, 7B
    const int T = 5;
    const std::vector<float> x = random_rows(T, n, rng), y = random_rows(T, n, rng), b = random_rows(1, n, rng);
    std::vector<float> want_add = x, want_bias = x, want_scale = x;
    model::add_inplace(want_add.data(), y.data(), int64_t(T) * n);
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < n; ++i) want_bias[size_t(t) * n + i] += b[size_t(i)];
    const float sc = std::sqrt(2304.f);  // Gemma 3 2B: sqrt(d_model)
    for (auto& v : want_scale) v *= sc;

    DeviceArray<float> dx(x), dy(y), db(b), dbias(x), dscale(x);
    add(dx.get(), dy.get(), int64_t(T) * n, s.get());
    add_bias(dbias.get(), db.get(), T, n, s.get());
    scale(dscale.get(), sc, int64_t(T) * n, s.get());
    s.sync();
    EXPECT_EQ(compare(dx.download(), want_add).differ, 0u) << "add, n " << n;
    EXPECT_EQ(compare(dbias.download(), want_bias).differ, 0u) << "add_bias, n " << n;
    EXPECT_EQ(compare(dscale.download(), want_scale).differ, 0u) << "scale, n " << n;
  }
}

// ---------------------------------------------------------------------------
// f32 -> bf16: bitwise activekv::f32_to_bf16, including ties, NaN payloads,
// infinities, subnormals and the overflow to inf.

TEST(F32ToBf16, BitwiseTheHostRule) {
  AKV_NEED_GPU();
  std::mt19937_64 rng(6000);
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,  // +-0, +-inf
                                0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7fa5a5a5u,  // NaNs, signalling
                                0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x3f807fffu,  // ties to even, near ties
                                0x00000001u, 0x00408000u, 0x807fffffu,               // subnormals
                                0x7f7fffffu, 0xff7fffffu};                           // max: rounds to inf
  while (bits.size() % 4 != 0) bits.push_back(0x3f800000u);
  for (int i = 0; i < 40000; ++i) bits.push_back(uint32_t(rng()));  // every exponent and payload
  std::vector<float> x(bits.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::bit_cast<float>(bits[i]);
  Stream s;
  for (const size_t off : {size_t(0), size_t(1)}) {  // 0: float4 path; 1: misaligned, scalar path
    const int64_t n = int64_t(x.size() - off);
    DeviceArray<float> dx(x);
    DeviceArray<uint16_t> dout(x.size());
    dout.poison();
    f32_to_bf16(dx.get() + off, dout.get() + off, n, s.get());
    s.sync();
    const std::vector<uint16_t> got = dout.download();
    size_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t want = activekv::f32_to_bf16(x[size_t(i) + off]).bits;
      if (got[size_t(i) + off] != want && bad++ < 5)
        ADD_FAILURE() << "f32 0x" << std::hex << bits[size_t(i) + off] << ": GPU 0x" << got[size_t(i) + off]
                      << ", host 0x" << want;
    }
    EXPECT_EQ(bad, 0u) << "offset " << off;
  }
}

// ---------------------------------------------------------------------------
// Sizes of 0 launch nothing; bad arguments throw before any launch.

TEST(ModelOps, EmptyIsANoOpAndBadArgumentsThrow) {
  AKV_NEED_GPU();
  Stream s;
  DeviceArray<float> a(std::vector<float>{1.f, 2.f, 3.f, 4.f});
  rms_norm(nullptr, nullptr, 0, 0, 1e-5f, nullptr, s.get());
  swiglu(nullptr, nullptr, 0, s.get());
  add_bias(a.get(), a.get(), 0, 4, s.get());
  s.sync();
  EXPECT_EQ(a.download(), (std::vector<float>{1.f, 2.f, 3.f, 4.f}));

  EXPECT_THROW(rms_norm(a.get(), a.get(), 1, -4, 1e-5f, a.get(), s.get()), InvalidArgument);
  EXPECT_THROW(rms_norm(a.get(), nullptr, 1, 4, 1e-5f, a.get(), s.get()), InvalidArgument);
  EXPECT_THROW(rms_norm(a.get(), a.get(), 1, 4, std::nanf(""), a.get(), s.get()), InvalidArgument);
  EXPECT_THROW(swiglu(a.get(), nullptr, 4, s.get()), InvalidArgument);
  EXPECT_THROW(add(a.get(), a.get(), -1, s.get()), InvalidArgument);
  EXPECT_THROW(f32_to_bf16(a.get(), nullptr, 4, s.get()), InvalidArgument);
  EXPECT_THROW(RopeFreqs(63, 10000.f, model::RopeLayout::Interleaved), InvalidArgument);
  EXPECT_THROW(RopeFreqs(64, 0.f, model::RopeLayout::Interleaved), InvalidArgument);
  EXPECT_THROW(RopeFreqs(64, INFINITY, model::RopeLayout::HalfSplit), InvalidArgument);
  const RopeFreqs f(64, 10000.f, model::RopeLayout::Interleaved);
  DeviceArray<int64_t> pos(std::vector<int64_t>{0});
  EXPECT_THROW(rope(a.get(), 1, 1, 32, pos.get(), f, s.get()), InvalidArgument);  // rope_dim 64 > head_dim 32
  try {
    rope(a.get(), 1, 1, 32, pos.get(), f, s.get());
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "cuda::rope: rope_dim 64 exceeds head_dim 32");
  }
}

// ---------------------------------------------------------------------------
// A decode batch's K/V in one launch (launch_write_kv_slots, decode_batch):
// every byte of every page -- device copies and a mapped host page -- is
// what launch_write_kv writes row by row, and nothing else is touched.

TEST(KvWriteSlots, BitwiseRowByRowWrites) {
  AKV_NEED_GPU();
  AttnShape sh;
  sh.n_kv_heads = 4, sh.group = 6, sh.head_dim = 256, sh.page_size = 16, sh.split_tokens = 16;
  const size_t page_elems = sh.page_bytes() / 2, row = size_t(sh.n_kv_heads) * sh.head_dim;
  constexpr int kRows = 3;
  std::mt19937_64 rng(77);
  DeviceArray<float> k(random_rows(kRows, int(row), rng)), v(random_rows(kRows, int(row), rng));
  // Two device pages and one host page per side (batched, row by row), poisoned alike.
  DeviceArray<uint16_t> dev[4] = {DeviceArray<uint16_t>(page_elems), DeviceArray<uint16_t>(page_elems),
                                  DeviceArray<uint16_t>(page_elems), DeviceArray<uint16_t>(page_elems)};
  for (auto& d : dev) d.poison();
  uint16_t* host[2];
  for (auto& h : host) {
    testing::ck(cudaMallocHost(&h, sh.page_bytes()), "cudaMallocHost");
    std::fill(h, h + page_elems, uint16_t(0xFFFF));
  }
  // Row 0 -> page A slot 5; row 1 -> page B slot 0 and the host page; row 2 -> page A slot 15.
  const KvSlot batched[kRows] = {{dev[0].get(), nullptr, 5}, {dev[1].get(), host[0], 0}, {dev[0].get(), nullptr, 15}};
  const KvSlot alone[kRows] = {{dev[2].get(), nullptr, 5}, {dev[3].get(), host[1], 0}, {dev[2].get(), nullptr, 15}};
  Stream s;
  launch_write_kv_slots(sh, k.get(), v.get(), int64_t(row), batched, kRows, s.get());
  for (int i = 0; i < kRows; ++i)
    launch_write_kv(sh, k.get() + i * row, v.get() + i * row, int64_t(row), 1, alone[i].slot, alone[i].device_page,
                    alone[i].host_page, s.get());
  s.sync();
  EXPECT_EQ(dev[0].download(), dev[2].download());
  EXPECT_EQ(dev[1].download(), dev[3].download());
  EXPECT_TRUE(std::equal(host[0], host[0] + page_elems, host[1]));
  size_t written = 0;  // 2 rows in page A: 2 x K and V of 4 heads x 256 channels
  for (const uint16_t e : dev[0].download()) written += e != 0xFFFF;
  EXPECT_EQ(written, size_t(2) * 2 * row);

  KvSlot bad = batched[0];
  EXPECT_THROW(launch_write_kv_slots(sh, k.get(), v.get(), int64_t(row), batched, 0, s.get()), InvalidArgument);
  EXPECT_THROW(launch_write_kv_slots(sh, k.get(), v.get(), int64_t(row), batched, kMaxKvSlots + 1, s.get()),
               InvalidArgument);
  bad.slot = sh.page_size;
  EXPECT_THROW(launch_write_kv_slots(sh, k.get(), v.get(), int64_t(row), &bad, 1, s.get()), InvalidArgument);
  bad = KvSlot{nullptr, nullptr, 0};
  EXPECT_THROW(launch_write_kv_slots(sh, k.get(), v.get(), int64_t(row), &bad, 1, s.get()), InvalidArgument);
  for (auto* h : host) cudaFreeHost(h);
}

// Head shards (tensor parallel, kv_write.h): shard shapes writing their
// heads' columns of the rows into one page give the whole shape's bytes, and
// a shard alone writes only its heads' planes.
TEST(KvWrite, HeadShardsWriteTheirPlanesOfTheWholePage) {
  AKV_NEED_GPU();
  AttnShape whole;
  whole.n_kv_heads = 3, whole.group = 2, whole.head_dim = 64, whole.page_size = 16, whole.split_tokens = 16;
  const size_t page_elems = whole.page_bytes() / 2, row = size_t(whole.n_kv_heads) * whole.head_dim;
  constexpr int kRows = 5;
  std::mt19937_64 rng(91);
  const std::vector<float> kh = random_rows(kRows, int(row), rng), vh = random_rows(kRows, int(row), rng);
  DeviceArray<float> k(kh), v(vh);
  DeviceArray<uint16_t> want(page_elems), got(page_elems);
  want.poison();
  got.poison();
  Stream s;
  launch_write_kv(whole, k.get(), v.get(), int64_t(row), kRows, 7, want.get(), nullptr, s.get());
  // Shards [0, 1) and [1, 3): each reads its heads' columns of the rows (row stride: the whole row).
  const int head0[2] = {0, 1}, heads[2] = {1, 2};
  for (int i = 1; i >= 0; --i) {
    AttnShape sh = whole;
    sh.kv_head0 = head0[i];
    sh.n_kv_heads = heads[i];
    sh.page_kv_heads = whole.n_kv_heads;
    ASSERT_TRUE(sh.sharded() || i == 0);
    const size_t off = size_t(head0[i]) * whole.head_dim;
    launch_write_kv(sh, k.get() + off, v.get() + off, int64_t(row), kRows, 7, got.get(), nullptr, s.get());
    s.sync();
    if (i == 1) {  // shard 1 alone: head 0's K and V planes untouched
      const std::vector<uint16_t> after = got.download();
      const size_t plane = size_t(whole.page_size) * whole.head_dim;
      for (const size_t p : {size_t(0), size_t(whole.n_kv_heads)})
        for (size_t j = 0; j < plane; ++j) ASSERT_EQ(after[p * plane + j], 0xFFFF) << "plane " << p << " elem " << j;
    }
  }
  EXPECT_EQ(got.download(), want.download());
  AttnShape outside = whole;  // heads [2, 4) of a 3-head page: refused, nothing written past the page
  outside.kv_head0 = 2;
  outside.n_kv_heads = 2;
  outside.page_kv_heads = 3;
  EXPECT_THROW(launch_write_kv(outside, k.get(), v.get(), int64_t(row), 1, 0, got.get(), nullptr, s.get()),
               InvalidArgument);
}

}  // namespace
}  // namespace activekv::cuda
