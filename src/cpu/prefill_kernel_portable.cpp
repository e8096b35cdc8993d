// The prefill attention item (prefill_kernel.h) in plain C++: V is eight
// floats, each operation the scalar one the AVX2 intrinsic performs per lane
// (std::fma for the fused multiply-add), so both units give the same bits.
// Built with -ffp-contract=off (CMakeLists.txt); the fallback where the CPU
// lacks AVX2 or FMA, and what the tests hold the AVX2 unit to.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "prefill_kernel.h"

namespace activekv::cpu::detail {
namespace {

struct Lanes {
  float v[8];
  struct Mask {
    bool b[8];
  };

  template <class F>
  static Lanes map(F f) {
    Lanes r;
    for (int i = 0; i < 8; ++i) r.v[i] = f(i);
    return r;
  }
  static Lanes load(const float* p) { return map([&](int i) { return p[i]; }); }
  static void store(float* p, Lanes a) { std::memcpy(p, a.v, sizeof a.v); }
  static Lanes set1(float x) { return map([&](int) { return x; }); }
  static Lanes zero() { return set1(0.0f); }
  static Lanes add(Lanes a, Lanes b) { return map([&](int i) { return a.v[i] + b.v[i]; }); }
  static Lanes sub(Lanes a, Lanes b) { return map([&](int i) { return a.v[i] - b.v[i]; }); }
  static Lanes mul(Lanes a, Lanes b) { return map([&](int i) { return a.v[i] * b.v[i]; }); }
  // _mm256_max_ps / _mm256_min_ps: the second operand unless the first is strictly greater / less.
  static Lanes max(Lanes a, Lanes b) { return map([&](int i) { return a.v[i] > b.v[i] ? a.v[i] : b.v[i]; }); }
  static Lanes min(Lanes a, Lanes b) { return map([&](int i) { return a.v[i] < b.v[i] ? a.v[i] : b.v[i]; }); }
  static Lanes fma(Lanes a, Lanes b, Lanes c) { return map([&](int i) { return std::fma(a.v[i], b.v[i], c.v[i]); }); }
  static Lanes floor(Lanes a) { return map([&](int i) { return std::floor(a.v[i]); }); }
  static Lanes pow2i(Lanes n) {
    return map([&](int i) {
      const uint32_t bits = uint32_t(int32_t(n.v[i]) + 127) << 23;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    });
  }
  static Lanes widen8(const uint16_t* p) {
    return map([&](int i) {
      const uint32_t bits = uint32_t(p[i]) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    });
  }
  static Mask lt(Lanes a, Lanes b) {
    Mask m;
    for (int i = 0; i < 8; ++i) m.b[i] = a.v[i] < b.v[i];
    return m;
  }
  static Mask eq(Lanes a, Lanes b) {
    Mask m;
    for (int i = 0; i < 8; ++i) m.b[i] = a.v[i] == b.v[i];
    return m;
  }
  static Mask unordered(Lanes a, Lanes b) {
    Mask m;
    for (int i = 0; i < 8; ++i) m.b[i] = a.v[i] != a.v[i] || b.v[i] != b.v[i];
    return m;
  }
  static Mask mask_or(Mask a, Mask b) {
    Mask m;
    for (int i = 0; i < 8; ++i) m.b[i] = a.b[i] || b.b[i];
    return m;
  }
  static Mask between(Lanes x, Lanes lo, Lanes hi) {
    Mask m;
    for (int i = 0; i < 8; ++i) m.b[i] = lo.v[i] <= x.v[i] && x.v[i] <= hi.v[i];
    return m;
  }
  static Lanes select(Mask m, Lanes a, Lanes b) { return map([&](int i) { return m.b[i] ? a.v[i] : b.v[i]; }); }
};

}  // namespace

void prefill_item_portable(const PrefillItem& it) { PrefillKernel<Lanes>(it).run(); }

}  // namespace activekv::cpu::detail
