// Host emulation of the matvec kernels (src/cuda/quant_matvec.cu), thread by
// thread: the same activation quantisation, the same per-thread work (the
// tiled kernel's tile loads and dots, src/cuda/quant_tile.cuh; the chunked
// kernel's items, src/cuda/quant_dot.cuh; both compiled here for the host),
// the same reductions in the same order. Every float operation is an explicitly rounded one (or an
// explicit fma) on both sides, so the GPU must reproduce these bits exactly;
// the emulation itself is checked against fp64 on the CPU (test_weights_host.cpp).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "quant_dot.cuh"
#include "quant_tile.cuh"
#include "weights_test_util.h"

namespace activekv::cuda::wtest {

/// x quantised as launch_quantize_activations does: qx [n_vec][cols], ds [n_vec][cols/32].
struct QuantizedX {
  std::vector<int8_t> qx;
  std::vector<float2> ds;
  qdot::XQuant view() const { return {qx.data(), ds.data()}; }
};

inline QuantizedX quantize_like_kernel(const std::vector<float>& x, int n_vec, int64_t cols) {
  QuantizedX q;
  q.qx.resize(size_t(n_vec * cols));
  for (int64_t b = 0; b < n_vec * cols / 32; ++b) {
    const float* xb = x.data() + 32 * b;
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
    const float id = amax == 0.f ? 0.f : 127.f / amax;
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
      const int v = int(std::nearbyint(xb[i] * id));  // round half to even, as __float2int_rn
      q.qx[size_t(32 * b + i)] = int8_t(v);
      sum += v;
    }
    q.ds.push_back(make_float2(amax / 127.f, float(sum)));
  }
  return q;
}

/// The warp's shuffle-xor reduction: after it every lane holds the same sum.
inline float butterfly_sum(std::array<float, 32> acc) {
  for (int o = 16; o > 0; o >>= 1) {
    std::array<float, 32> next;
    for (int l = 0; l < 32; ++l) next[size_t(l)] = acc[size_t(l)] + acc[size_t(l ^ o)];
    acc = next;
  }
  return acc[0];
}

/// The chunked kernel (a warp per R rows, 64-item chunks; a row's arithmetic
/// does not depend on R): row `row` of vector v.
template <class T>
float emulate_chunked_row(const HostMatrix& h, int64_t row, const QuantizedX& q, int v) {
  using Tl = qdot::Tiling<T>;
  const int n_blocks = int(h.cols / T::kElems);
  const uint8_t* rp = h.bytes.data() + row * h.row_bytes;
  // One vector at a time: the kernel's per-vector arithmetic does not depend on NV.
  const qdot::XQuant xq{q.qx.data() + v * h.cols, q.ds.data() + v * (h.cols / 32)};
  std::array<float, 32> acc{};
  for (int blk0 = 0; blk0 < n_blocks; blk0 += Tl::kChunkBlocks) {
    const int n_items = std::min(Tl::kChunkBlocks, n_blocks - blk0) * Tl::kItemsPerBlock;
    for (int lane = 0; lane < 32; ++lane) {
      for (int r = 0; r < Tl::kItemsPerChunk / 32; ++r) {
        const int item = lane + 32 * r;
        const uint8_t* chunk = rp + blk0 * T::kBytes;
        if (item < n_items) qdot::dot_item<T, 1>(&chunk, item, blk0, xq, h.cols, &acc[size_t(lane)]);
      }
    }
  }
  return butterfly_sum(acc);
}

/// The tiled kernel for n_vec vectors: row `row` of vector v. Its CTA holds
/// rows_per_cta rows; the row is the rr-th, so its tiles are the CTA's items
/// rr*tiles + t, thread (item % threads) adding each tile's dot to its
/// accumulator in item order; then a butterfly per warp and the warps' sums
/// in warp order.
template <class T>
float emulate_tiled_row(const HostMatrix& h, int64_t row, const QuantizedX& q, int v, int n_vec) {
  using Ti = qtile::TileOf<T>;
  const qtile::Geometry g = qtile::tile_geometry(h.rows, h.cols, int64_t(h.row_bytes), n_vec, Ti::kCanAlign);
  const qdot::XQuant xq{q.qx.data() + v * h.cols, q.ds.data() + v * (h.cols / 32)};
  const int threads = 32 * g.warps, rr = int(row % g.rows_per_cta);
  const int64_t total = h.rows * int64_t(h.row_bytes);
  std::vector<float> acc(size_t(threads), 0.f);
  for (int t = 0; t < g.tiles; ++t) {
    qblk::Words<Ti::kWords> tw;
    const int64_t off = row * int64_t(h.row_bytes) + int64_t(t) * Ti::kBytes;
    if constexpr (Ti::kCanAlign) {
      if (g.aligned) {
        qtile::load_tile<T, true>(h.bytes.data(), off, total, tw);
      } else {
        qtile::load_tile<T, false>(h.bytes.data(), off, total, tw);
      }
    } else {
      qtile::load_tile<T, false>(h.bytes.data(), off, total, tw);
    }
    float part = 0.f;
    qtile::tile_dot<T, 1>(tw, t, qtile::tile_units(t, h.cols), xq, h.cols, &part);
    acc[size_t((rr * g.tiles + t) % threads)] += part;
  }
  float y = 0.f;
  for (int w = 0; w < g.warps; ++w) {
    std::array<float, 32> lanes;
    std::copy(acc.begin() + 32 * w, acc.begin() + 32 * (w + 1), lanes.begin());
    const float s = butterfly_sum(lanes);
    y = w == 0 ? s : y + s;
  }
  return y;
}

template <class T>
float emulate_float_row(const HostMatrix& h, int64_t row, const std::vector<float>& x, int v) {
  const uint8_t* rp = h.bytes.data() + row * h.row_bytes;
  const float* xv = x.data() + v * h.cols;
  std::array<float, 32> acc{};
  for (int lane = 0; lane < 32; ++lane) {
    for (int64_t e = 8 * lane; e < h.cols; e += 256) {
      float w[8];
      T::decode8(rp, e, w);
      for (int k = 0; k < 8; ++k) acc[size_t(lane)] = std::fma(w[k], xv[e + k], acc[size_t(lane)]);
    }
  }
  return butterfly_sum(acc);
}

/// y [n_vec][rows] as launch_matvec(accumulate = false) computes it with `kernel`.
inline std::vector<float> emulate_matvec(const HostMatrix& h, const std::vector<float>& x, int n_vec,
                                         BlockMatvecKernel kernel = BlockMatvecKernel::Tiled) {
  std::vector<float> y(size_t(n_vec * h.rows));
  auto fill = [&](auto row_fn) {
    for (int v = 0; v < n_vec; ++v)
      for (int64_t r = 0; r < h.rows; ++r) y[size_t(v * h.rows + r)] = row_fn(r, v);
  };
  const bool block = qblk::dispatch_block_type(h.type, [&](auto t) {
    const QuantizedX q = quantize_like_kernel(x, n_vec, h.cols);
    using T = decltype(t);
    if (kernel == BlockMatvecKernel::Tiled) {
      fill([&](int64_t r, int v) { return emulate_tiled_row<T>(h, r, q, v, n_vec); });
    } else {
      fill([&](int64_t r, int v) { return emulate_chunked_row<T>(h, r, q, v); });
    }
  });
  if (!block) {
    qblk::dispatch_float_type(h.type, [&](auto t) {
      fill([&](int64_t r, int v) { return emulate_float_row<decltype(t)>(h, r, x, v); });
    });
  }
  return y;
}

// ---- fp64 references --------------------------------------------------------------

/// Errors of a matvec result against the two fp64 references, max over (vector, row).
struct MatvecErrors {
  double rel_emul = 0;     // |y - sum w*x_hat| / sum |w*x_hat|       (fp32 rounding only)
  double worst_ratio = 0;  // |y - sum w*x| / (sum |w| d/2 + fp32 part) (hard activation-rounding bound: <= 1)
  double z = 0;            // |y - sum w*x| / sqrt(sum w^2 d^2 / 12)    (statistical, uniform rounding)
  void merge(const MatvecErrors& o) {
    rel_emul = std::max(rel_emul, o.rel_emul);
    worst_ratio = std::max(worst_ratio, o.worst_ratio);
    z = std::max(z, o.z);
  }
};

/// y [n_vec][rows] against sum_c w[r][c] * x_hat[v][c] (x_hat = d * q, the
/// kernel's quantised x; x itself for float types) and against the exact x,
/// both in fp64 over the dequantised weights wd [rows][cols].
inline MatvecErrors compare_matvec(const HostMatrix& h, const std::vector<float>& wd, const std::vector<float>& x,
                                   int n_vec, const std::vector<float>& y, double emul_bound) {
  MatvecErrors e;
  const bool quant = !is_float_type(h.type);
  const QuantizedX q = quant ? quantize_like_kernel(x, n_vec, h.cols) : QuantizedX{};
  for (int v = 0; v < n_vec; ++v) {
    const float* xv = x.data() + v * h.cols;
    std::vector<double> xh(static_cast<size_t>(h.cols)), dq(static_cast<size_t>(h.cols), 0.0);
    for (int64_t c = 0; c < h.cols; ++c) {
      if (quant) {
        dq[size_t(c)] = q.ds[size_t(v * (h.cols / 32) + c / 32)].x;
        xh[size_t(c)] = dq[size_t(c)] * q.qx[size_t(v * h.cols + c)];
      } else {
        xh[size_t(c)] = xv[c];
      }
    }
    for (int64_t r = 0; r < h.rows; ++r) {
      const float* w = wd.data() + r * h.cols;
      double emul = 0, mag = 0, exact = 0, worst = 0, var = 0;
      for (int64_t c = 0; c < h.cols; ++c) {
        const double wc = w[c], dc = dq[size_t(c)];
        emul += wc * xh[size_t(c)];
        mag += std::fabs(wc * xh[size_t(c)]);
        exact += wc * double(xv[c]);
        worst += std::fabs(wc) * dc / 2;
        var += wc * wc * dc * dc / 12;
      }
      const double yv = y[size_t(v * h.rows + r)];
      const double err_emul = std::fabs(yv - emul), err_exact = std::fabs(yv - exact);
      e.rel_emul = std::max(e.rel_emul, mag > 0 ? err_emul / mag : err_emul);
      if (quant) {
        e.worst_ratio = std::max(e.worst_ratio, err_exact / (worst + emul_bound * mag + 1e-30));
        if (var > 0) e.z = std::max(e.z, err_exact / std::sqrt(var));
      }
    }
  }
  return e;
}

// Bounds. The GPU must equal the emulation bitwise (the GPU test asserts it),
// so they were measured on the CPU: test_weights_host, every shape of
// shapes_for below with n_vec 1, 2 and 8 (build/bin/test_cuda_weights_host).
//  - rel_emul, |y - fp64 sum w*x_hat| / sum |w*x_hat|: measured max 2.5e-8
//    (Q5_K) to 4.4e-8 (Q8_0, F32) for the chunked kernel, 3.1e-8 (Q4_1) to
//    7.1e-8 (Q8_0) for the tiled one (at 17408 cols a tile's 8 units sum
//    first, then up to 68 tiles of a row over 68 threads and the warps);
//    asserted 1.5e-7 (2-3x). Analysis: each unit's term d_x*(A*sum_int +
//    B*sum_q) carries ~4 fp32 roundings and is summed in a fixed order of
//    depth <= 17 + 5 (chunked) or 8 + 1 + 5 + 2 (tiled); float weights chain
//    cols/32 FMAs per lane. The worst case (gamma_30 ~ 1.8e-6, gamma_550 ~
//    3.3e-5 for floats) is far above what random-sign rounding errors give
//    (~sqrt(n) u).
//  - activation rounding: |x - x_hat| <= d/2 per element gives the hard bound
//    sum |w| d/2, which cannot be exceeded (worst_ratio <= 1; measured max
//    0.213 (Q5_0), asserted 0.5); as independent uniform errors the sum has
//    standard deviation sqrt(sum w^2 d^2 / 12): measured max z 4.6 (Q5_0)
//    over the ~40000 (row, vector) pairs of a type, asserted 10.
constexpr double kEmulBoundQuant = 1.5e-7, kEmulBoundFloat = 1.5e-7, kWorstRatioBound = 0.5, kZBound = 10.0;

struct Shape {
  int64_t rows, cols;
};

/// rows never a multiple of the chunked kernel's 4-row CTA; cols span one
/// partial chunk (256, 576), several (1536, 5120) and more chunks than its
/// pipeline's 4 stages (17408). For the tiled kernel: partial tiles (576),
/// tiles not 16-byte aligned (576, and Q6_K always), and CTAs of several rows
/// (2563 rows: 5 per CTA of 4 warps at 5120 cols, the last CTA partial) --
/// fewer than 1024 rows get one row per CTA (the >= 512-CTA rule).
inline std::vector<Shape> shapes_for(TensorType t) {
  // 4099 and 8203 rows: the chunked kernel takes 2 rows per warp there for
  // one vector of a 4-bit type, the last warp 1 of them.
  std::vector<Shape> s = {{133, 256}, {301, 1536}, {67, 5120}, {19, 17408}, {2563, 5120}, {4099, 512}, {8203, 256}};
  if (gguf::block_elements(t) <= 32) s.push_back({45, 576}), s.push_back({8203, 576});  // SmolLM2's d_model
  return s;
}

inline const char* kernel_name(BlockMatvecKernel k) {
  return k == BlockMatvecKernel::Tiled ? "tiled" : "chunked";
}

}  // namespace activekv::cuda::wtest
