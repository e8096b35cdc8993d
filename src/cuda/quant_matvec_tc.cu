// The batched decode matvec on int8 tensor cores: matvec_tc.h says why and
// how its bits equal the chunked kernel's.
//
// A CTA takes 16 rows (one m16 tile) and 4 warps; warp w takes the units u
// with u % 32 in [8w, 8w + 8): eight consecutive units, then the next 32.
// Per unit, lane (g, q) = (lane / 4, lane % 4) builds the mma fragments
// straight from global memory (PTX "Matrix Fragments for mma.m16n8k32",
// .s8; layouts in int8s_tc_fragments.cuh):
//   A = the 16 rows' raw codes (T::raw4, bytes < 0x80 or signed int8):
//       a0/a2 = row g, elements 4q.. and 16 + 4q..; a1/a3 = row g + 8
//   B = vector g's int8 x: elements 4q.. (b0) and 16 + 4q.. (b1); 0 past n_vec
//   C = the exact int32 dots (row g, vectors 2q, 2q + 1; row g + 8, same)
// and adds dot_unit_x's epilogue of each C entry to the entry's slot.
#include <cuda_runtime.h>

#include <cstdlib>
#include <type_traits>

#include "activekv/core/error.h"
#include "matvec_host.h"
#include "matvec_tc.h"
#include "mma_util.cuh"

namespace activekv::cuda::mvtc {
namespace {

using qdot::XQuant;
using qblk::ldg;

constexpr int kWarps = 4;
constexpr int kSlots = 32;                  // the chunked kernel's lanes
constexpr int kSlotsPerWarp = kSlots / kWarps;
constexpr int kVecs = 8;                    // the mma's n

/// One C entry's unit epilogue, dot_unit_x's arithmetic: s is sum(raw * q).
template <class T>
__device__ __forceinline__ float unit_term(int s, float a, float mn, float2 d, float acc) {
  if constexpr (T::kOffset != 0) s -= T::kOffset * int(d.y);
  float t = qblk::mul_rn(a, float(s));
  if constexpr (T::kHasMin) t = fmaf(mn, d.y, t);
  return fmaf(d.x, t, acc);
}

/// Rows [tile * 16, + 16) of one matrix: the body of both kernels.
template <class T>
__device__ __forceinline__ void tc_cta(const uint8_t* __restrict__ w, int64_t rows, int64_t row_bytes, int n_units,
                                       XQuant xq, int64_t cols, int n_vec, float* __restrict__ y, bool accumulate,
                                       int64_t tile) {
  __shared__ float slots[kSlots][kRowsPerCta][kVecs];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int64_t r_lo = tile * kRowsPerCta + g, r_hi = r_lo + 8;
  const bool ok_lo = r_lo < rows, ok_hi = r_hi < rows;
  const uint8_t* w_lo = w + (ok_lo ? r_lo : 0) * row_bytes;
  const uint8_t* w_hi = w + (ok_hi ? r_hi : 0) * row_bytes;
  const bool x_ok = g < n_vec;
  const int8_t* xg = xq.qx + (x_ok ? g : 0) * cols;
  const int64_t ds_stride = cols / 32;
  const int v0 = 2 * q, v1 = 2 * q + 1;  // this lane's C columns

  float acc[kSlotsPerWarp][4];
#pragma unroll
  for (int j = 0; j < kSlotsPerWarp; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;

  for (int base = kSlotsPerWarp * warp; base < n_units; base += kSlots) {
#pragma unroll
    for (int j = 0; j < kSlotsPerWarp; ++j) {
      const int u = base + j;
      if (u >= n_units) break;  // uniform over the warp
      const int blk = u / T::kUnits, part = u % T::kUnits;
      const uint8_t* b_lo = w_lo + int64_t(blk) * T::kBytes;
      const uint8_t* b_hi = w_hi + int64_t(blk) * T::kBytes;
      const uint4 a = make_uint4(ok_lo ? T::raw4(b_lo, part, q) : 0u, ok_hi ? T::raw4(b_hi, part, q) : 0u,
                                 ok_lo ? T::raw4(b_lo, part, q + 4) : 0u, ok_hi ? T::raw4(b_hi, part, q + 4) : 0u);
      const int* xu = reinterpret_cast<const int*>(xg + int64_t(u) * 32);
      const uint32_t b0 = x_ok ? uint32_t(ldg(xu + q)) : 0u, b1 = x_ok ? uint32_t(ldg(xu + 4 + q)) : 0u;
      int c[4] = {0, 0, 0, 0};
      detail::mma_s8_16832(c, a, b0, b1);
      const float a_lo = ok_lo ? T::scale(b_lo, part, 0) : 0.f, a_hi = ok_hi ? T::scale(b_hi, part, 0) : 0.f;
      float m_lo = 0.f, m_hi = 0.f;
      if constexpr (T::kHasMin) {
        m_lo = ok_lo ? T::min(b_lo, part) : 0.f;
        m_hi = ok_hi ? T::min(b_hi, part) : 0.f;
      }
      if (v0 < n_vec) {
        const float2 d = ldg(xq.ds + v0 * ds_stride + u);
        acc[j][0] = unit_term<T>(c[0], a_lo, m_lo, d, acc[j][0]);
        acc[j][2] = unit_term<T>(c[2], a_hi, m_hi, d, acc[j][2]);
      }
      if (v1 < n_vec) {
        const float2 d = ldg(xq.ds + v1 * ds_stride + u);
        acc[j][1] = unit_term<T>(c[1], a_lo, m_lo, d, acc[j][1]);
        acc[j][3] = unit_term<T>(c[3], a_hi, m_hi, d, acc[j][3]);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kSlotsPerWarp; ++j) {
    float(&s)[kRowsPerCta][kVecs] = slots[kSlotsPerWarp * warp + j];
    s[g][v0] = acc[j][0];
    s[g][v1] = acc[j][1];
    s[g + 8][v0] = acc[j][2];
    s[g + 8][v1] = acc[j][3];
  }
  __syncthreads();
  // Thread t sums row t / 8, vector t % 8 as the chunked kernel's xor
  // butterfly leaves it in lane 0: after the step of offset o, lane l < o
  // holds its value plus lane l + o's (commutative: the same bits).
  const int r = threadIdx.x / kVecs, v = threadIdx.x % kVecs;
  const int64_t row = tile * kRowsPerCta + r;
  if (row >= rows || v >= n_vec) return;
  float t[kSlots];
#pragma unroll
  for (int l = 0; l < kSlots; ++l) t[l] = slots[l][r][v];
#pragma unroll
  for (int o = kSlots / 2; o > 0; o >>= 1)
#pragma unroll
    for (int l = 0; l < o; ++l) t[l] += t[l + o];
  float* p = y + int64_t(v) * rows + row;
  *p = accumulate ? *p + t[0] : t[0];
}

template <class T>
__global__ void __launch_bounds__(kWarps * 32)
    matvec_tc_kernel(const uint8_t* __restrict__ w, int64_t rows, int64_t row_bytes, int n_units, XQuant xq,
                     int64_t cols, int n_vec, float* __restrict__ y, bool accumulate) {
  tc_cta<T>(w, rows, row_bytes, n_units, xq, cols, n_vec, y, accumulate, blockIdx.x);
}

/// The matrices of a grouped launch: matrix i owns tiles [tile_end[i-1], tile_end[i]).
struct TcGroup {
  const uint8_t* w[kMaxMatvecGroup];
  float* y[kMaxMatvecGroup];
  int64_t rows[kMaxMatvecGroup];
  uint32_t tile_end[kMaxMatvecGroup];
  int n;
};

template <class T>
__global__ void __launch_bounds__(kWarps * 32)
    matvec_tc_group_kernel(TcGroup gr, int64_t row_bytes, int n_units, XQuant xq, int64_t cols, int n_vec) {
  int i = 0;
  while (i < gr.n - 1 && blockIdx.x >= gr.tile_end[i]) ++i;
  const int64_t tile = int64_t(blockIdx.x) - (i > 0 ? int64_t(gr.tile_end[i - 1]) : 0);
  tc_cta<T>(gr.w[i], gr.rows[i], row_bytes, n_units, xq, cols, n_vec, gr.y[i], false, tile);
}

bool turned_off() {
  static const bool off = [] {
    const char* e = std::getenv("ACTIVEKV_MATVEC_TC");
    return e != nullptr && e[0] == '0';
  }();
  return off;
}

/// Calls f(T{}) for the block type t if the kernel takes it (items = units: not Q6_K).
template <class F>
void dispatch(gguf::TensorType t, F&& f) {
  qblk::dispatch_block_type(t, [&](auto b) {
    if constexpr (!std::is_same_v<decltype(b), qblk::Q6_K>) f(b);
  });
}

unsigned tiles(int64_t rows) { return unsigned((rows + kRowsPerCta - 1) / kRowsPerCta); }

}  // namespace

bool takes(gguf::TensorType t, int n_vec) {
  return n_vec >= 2 && n_vec <= kVecs && !turned_off() && t != gguf::TensorType::Q6_K &&
         qblk::dispatch_block_type(t, [](auto) {});
}

void launch(const DeviceMatrix& w, int n_vec, const XQuant& xq, float* y, bool accumulate, cudaStream_t stream) {
  if (w.rows == 0) return;
  dispatch(w.type, [&](auto b) {
    using T = decltype(b);
    const int n_units = int(w.cols / 32);
    matvec_tc_kernel<T><<<tiles(w.rows), kWarps * 32, 0, stream>>>(static_cast<const uint8_t*>(w.data), w.rows,
                                                                     int64_t(w.row_bytes), n_units, xq, w.cols, n_vec,
                                                                     y, accumulate);
  });
  check_cuda(cudaGetLastError(), "tensor-core matvec kernel launch");
}

void launch_group(const MatvecGroupItem* items, int n, int n_vec, const XQuant& xq, cudaStream_t stream) {
  TcGroup gr{};
  gr.n = n;
  uint32_t end = 0;
  for (int i = 0; i < n; ++i) {
    gr.w[i] = static_cast<const uint8_t*>(items[i].w->data);
    gr.y[i] = items[i].y;
    gr.rows[i] = items[i].w->rows;
    end += tiles(items[i].w->rows);
    gr.tile_end[i] = end;
  }
  if (end == 0) return;
  const DeviceMatrix& w0 = *items[0].w;
  dispatch(w0.type, [&](auto b) {
    using T = decltype(b);
    matvec_tc_group_kernel<T><<<end, kWarps * 32, 0, stream>>>(gr, int64_t(w0.row_bytes), int(w0.cols / 32), xq,
                                                               w0.cols, n_vec);
  });
  check_cuda(cudaGetLastError(), "grouped tensor-core matvec kernel launch");
}

}  // namespace activekv::cuda::mvtc
