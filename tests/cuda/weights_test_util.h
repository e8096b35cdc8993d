// Shared by the GPU weight-kernel tests: random GGUF-typed weights, device
// buffers, and the CPU emulation of the matvec's activation quantisation.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "activekv/cuda/quant_matvec.h"
#include "activekv/gguf/tensor_type.h"

namespace activekv::cuda::wtest {

using gguf::TensorType;

inline const std::vector<TensorType>& all_types() {
  static const std::vector<TensorType> t = {TensorType::F32,  TensorType::F16,  TensorType::BF16,
                                            TensorType::Q8_0, TensorType::Q4_0, TensorType::Q4_1,
                                            TensorType::Q5_0, TensorType::Q4_K, TensorType::Q5_K,
                                            TensorType::Q6_K};
  return t;
}

inline bool is_float_type(TensorType t) {
  return t == TensorType::F32 || t == TensorType::F16 || t == TensorType::BF16;
}

inline void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

/// A device allocation, freed on scope exit.
struct DevMem {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DevMem(size_t n) : bytes(n) { ck(cudaMalloc(&p, n < 16 ? 16 : n), "cudaMalloc"); }
  ~DevMem() { cudaFree(p); }
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
  template <class T> T* as() const { return static_cast<T*>(p); }
  /// Fills with 0xff bytes (NaN as fp32 and bf16): output the kernel forgets stays visible.
  void poison() { ck(cudaMemset(p, 0xff, bytes), "cudaMemset"); }
};

template <class T>
void upload(DevMem& d, const std::vector<T>& h) {
  ck(cudaMemcpy(d.p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}
template <class T>
std::vector<T> download(const DevMem& d, size_t n) {
  std::vector<T> h(n);
  ck(cudaMemcpy(h.data(), d.p, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  return h;
}

/// Deterministic uniform numbers from mt19937_64 (std distributions differ
/// between standard libraries; this does not).
struct Rng {
  std::mt19937_64 g;
  explicit Rng(uint64_t seed) : g(seed) {}
  double uniform(double lo, double hi) { return lo + (hi - lo) * double(g() >> 11) * 0x1p-53; }
  uint8_t byte() { return uint8_t(g() >> 56); }
};

/// Finite f32 -> f16 bits by truncation (|v| < 2^-14 becomes a signed zero):
/// enough to write sane random scales, no rounding subtleties needed.
inline uint16_t f16_bits_trunc(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const int exp = int((u >> 23) & 0xff) - 127;
  if (exp < -14) return sign;
  return uint16_t(sign | ((exp + 15) << 10) | ((u >> 13) & 0x3ffu));
}

/// A weight matrix on the host: `rows` rows of row_bytes bytes of `type`.
struct HostMatrix {
  TensorType type;
  int64_t rows = 0, cols = 0;
  size_t row_bytes = 0;
  std::vector<uint8_t> bytes;

  /// gguf::dequantize of every row, [rows][cols].
  std::vector<float> dequant() const {
    std::vector<float> out(size_t(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
      gguf::dequantize(type, bytes.data() + r * row_bytes, out.data() + r * cols, uint64_t(cols));
    }
    return out;
  }
};

inline void put_half(uint8_t* p, Rng& rng, double lo, double hi) {
  const uint16_t h = f16_bits_trunc(float(rng.uniform(lo, hi)));
  std::memcpy(p, &h, 2);
}

/// Random blocks whose f16 scales are finite and sane (the ranges of
/// tools/make_gguf_fixtures.py), so every value is finite; float types get
/// values in [-1, 1]. With raw_bits, float types are random bit patterns
/// (NaN, inf, subnormals: for the bitwise conversion tests).
inline HostMatrix random_matrix(TensorType t, int64_t rows, int64_t cols, uint64_t seed, bool raw_bits = false) {
  HostMatrix m{t, rows, cols, gguf::row_bytes(t, uint64_t(cols)), {}};
  m.bytes.resize(size_t(rows) * m.row_bytes);
  Rng rng(seed);
  for (auto& b : m.bytes) b = rng.byte();
  if (raw_bits) return m;
  const size_t bb = gguf::block_bytes(t), n_blocks = m.bytes.size() / bb;
  for (size_t i = 0; i < n_blocks; ++i) {
    uint8_t* b = m.bytes.data() + i * bb;
    switch (t) {
      case TensorType::F32: {
        const float v = float(rng.uniform(-1, 1));
        std::memcpy(b, &v, 4);
        break;
      }
      case TensorType::F16: put_half(b, rng, -1, 1); break;
      case TensorType::BF16: {
        const float v = float(rng.uniform(-1, 1));
        uint32_t u;
        std::memcpy(&u, &v, 4);
        const uint16_t h = uint16_t(u >> 16);
        std::memcpy(b, &h, 2);
        break;
      }
      case TensorType::Q8_0:
      case TensorType::Q4_0:
      case TensorType::Q5_0: put_half(b, rng, -0.1, 0.1); break;
      case TensorType::Q4_1:
        put_half(b, rng, 0.0, 0.1);
        put_half(b + 2, rng, -1.0, 1.0);
        break;
      case TensorType::Q4_K:
      case TensorType::Q5_K:
        put_half(b, rng, 0.0, 0.01);
        put_half(b + 2, rng, 0.0, 0.01);
        break;
      case TensorType::Q6_K: put_half(b + 208, rng, -0.01, 0.01); break;
      default: throw std::runtime_error("random_matrix: unexpected type");
    }
  }
  return m;
}

/// A HostMatrix uploaded (cudaMalloc: 256-byte aligned), in the GGUF layout
/// or repacked on the GPU into the split one (launch_repack_split).
struct DeviceCopy {
  DevMem mem;
  DeviceMatrix m;
  explicit DeviceCopy(const HostMatrix& h, WeightLayout layout = WeightLayout::Gguf)
      : mem(h.bytes.size()), m{h.type, mem.p, h.rows, h.cols, h.row_bytes, layout} {
    if (layout == WeightLayout::Gguf) {
      upload(mem, h.bytes);
      return;
    }
    DevMem src(h.bytes.size());
    upload(src, h.bytes);
    launch_repack_split(src.p, m, nullptr);
    ck(cudaDeviceSynchronize(), "repack");
  }
};

/// The layouts a type has: GGUF, and split for Q4_0, Q4_1, Q5_0, Q8_0, Q6_K.
inline std::vector<WeightLayout> layouts_for(TensorType t) {
  if (has_split_layout(t)) return {WeightLayout::Gguf, WeightLayout::Split};
  return {WeightLayout::Gguf};
}

inline const char* layout_name(WeightLayout l) { return l == WeightLayout::Split ? "split" : "gguf"; }

/// Random activations in [-1, 1] for n_vec vectors of cols, with one
/// all-zero block (amax = 0) and one block holding a single large value.
inline std::vector<float> random_x(int n_vec, int64_t cols, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> x(size_t(n_vec * cols));
  for (auto& v : x) v = float(rng.uniform(-1, 1));
  for (int i = 0; i < 32; ++i) x[size_t(i)] = 0.f;
  if (cols >= 64) {
    for (int i = 32; i < 64; ++i) x[size_t(i)] *= 1e-3f;
    x[40] = 7.5f;
  }
  return x;
}

}  // namespace activekv::cuda::wtest
