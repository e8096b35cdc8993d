// Kernels of activekv/cuda/model_ops.h (launchers: model_ops_kernels.h).
//
// Bit agreement with the CPU reference (src/model/ops.cpp) is the design
// rule: fp32 arithmetic goes through the __f*_rn intrinsics, which nvcc never
// contracts into FMAs (the CPU build has no FMA either), in the CPU's order;
// the CPU's double intermediates stay double here. Elementwise kernels read
// float4 when every pointer is 16-byte aligned and the length a multiple of 4
// (free bandwidth), else floats; all loop grid-stride.
#include <cub/block/block_reduce.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "activekv/cuda/decode_attention.h"
#include "model_ops_kernels.h"
#include "pdl.cuh"
#include "quant_x.cuh"

namespace activekv::cuda::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;  // enough to fill an H200 (132 SMs x 8 blocks) several times

int grid_for(int64_t work) { return int(std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, kMaxBlocks)); }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void check_launch(const char* what) { check_cuda(cudaGetLastError(), what); }

__device__ inline int64_t thread_index() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t grid_stride() { return int64_t(gridDim.x) * blockDim.x; }

// ---- elementwise: a[i] = op(a[i], b[i mod period]) -------------------------

struct SwiGLUOp {
  // ops.cpp: g / (1.0f + std::exp(-g)) * up, with glibc's expf (correctly
  // rounded but for rare cases); exp in double rounded once to fp32 is that.
  __device__ float operator()(float g, float u) const {
    const float e = float(exp(-double(g)));
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, e)), u);
  }
};

struct GeGLUTanhOp {
  __device__ float operator()(float g, float u) const {
    const double x = g;
    const double z = 0.7978845608028654 * (x + 0.044715 * x * x * x);  // sqrt(2/pi) (x + 0.044715 x^3)
    return __fmul_rn(float(x / (1.0 + exp(-2.0 * z))), u);  // 0.5 x (1 + tanh z) = x / (1 + e^-2z)
  }
};

struct AddOp {
  __device__ float operator()(float x, float y) const { return __fadd_rn(x, y); }
};

struct ScaleOp {
  float s;
  __device__ float operator()(float x, float) const { return __fmul_rn(x, s); }
};

template <class Op>
__device__ inline float4 apply4(const float4 a, const float4 b, Op op) {
  return make_float4(op(a.x, b.x), op(a.y, b.y), op(a.z, b.z), op(a.w, b.w));
}

// b == nullptr: op ignores its second operand (scale). period > 0: b is one
// row of `period` elements broadcast over a (bias); 0: b as long as a.
// kQuant (float4, n a multiple of 8 float4s): each 32-element block of the
// output is also quantised for the matvec into qx/ds (block i / 8 of the
// flat [rows][cols] workspace) by the 8 lanes that hold it; the grid stride
// is a multiple of 8, so those lanes are always together.
template <class V, class Op, bool kQuant = false>
__global__ void binary_kernel(V* a, const V* b, int64_t n, int64_t period, Op op, int8_t* qx = nullptr,
                              float2* ds = nullptr) {
  pdl::begin();
  for (int64_t i = thread_index(); i < n; i += grid_stride()) {
    const V y = b == nullptr ? a[i] : b[period > 0 ? i % period : i];
    if constexpr (sizeof(V) == sizeof(float4)) {
      const float4 r = apply4(a[i], y, op);
      a[i] = r;
      if constexpr (kQuant) {
        const float v[4] = {r.x, r.y, r.z, r.w};
        const int lane = threadIdx.x & 31;
        qx::quantize_block<4>(v, 0xffu << (lane & 24), int(i & 7), qx + 32 * (i / 8), ds + i / 8);
      }
    } else {
      static_assert(!kQuant, "the quantising epilogue reads float4s");
      a[i] = op(a[i], y);
    }
  }
}

template <class Op>
void launch_binary(float* a, const float* b, int64_t n, int64_t period, Op op, cudaStream_t stream,
                   const char* what) {
  if (n == 0) return;
  const bool vec = n % 4 == 0 && period % 4 == 0 && aligned16(a) && (b == nullptr || aligned16(b));
  if (vec) {
    pdl::launch(what, binary_kernel<float4, Op, false>, grid_for(n / 4), kThreads, 0, stream,
                reinterpret_cast<float4*>(a), reinterpret_cast<const float4*>(b), n / 4, period / 4, op, nullptr,
                nullptr);
  } else {
    pdl::launch(what, binary_kernel<float, Op, false>, grid_for(n), kThreads, 0, stream, a, b, n, period, op,
                nullptr, nullptr);
  }
}

// ---- f32 -> bf16 -------------------------------------------------------------

// The rule of activekv::f32_to_bf16 (core/bf16.h), on the raw bits.
__device__ inline uint16_t to_bf16(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);  // NaN: quiet, sign + payload kept
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__global__ void bf16_kernel(const float* x, uint16_t* out, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += grid_stride()) out[i] = to_bf16(x[i]);
}

__global__ void bf16_kernel4(const float4* x, uint2* out, int64_t n4) {
  for (int64_t i = thread_index(); i < n4; i += grid_stride()) {
    const float4 v = x[i];
    out[i] = make_uint2(uint32_t(to_bf16(v.x)) | uint32_t(to_bf16(v.y)) << 16,
                        uint32_t(to_bf16(v.z)) | uint32_t(to_bf16(v.w)) << 16);  // little endian
  }
}

// ---- RMSNorm: one block per row ---------------------------------------------

// Threads per row: wide rows (a model's d_model) take 1024, so that a decode
// step's single row is not one 256-thread block walking it five float4s deep
// twice over; narrow ones (QK-norm over a head) 256. A function of the row
// width alone: a row's result never depends on how many rows a launch has
// (the batch == solo contract).
constexpr int kWideNormThreads = 1024;
int norm_threads(int n) { return n >= 2048 ? kWideNormThreads : kThreads; }

__device__ inline double sq(float v) { return double(v) * double(v); }  // exact in double

// kQuant (needs kVec4, n % 32 == 0): each output block of 32 is also
// quantised for the matvec into qx/ds (row blockIdx.x of the workspace) by the
// 8 lanes that hold it (qx::quantize_block): the norm's output feeds the next
// matvecs without a launch of its own to quantise it.
template <int kBlock, bool kVec4, bool kQuant>
__global__ void __launch_bounds__(kBlock) rms_norm_kernel(const float* x, const float* w, int n, float eps, float* out,
                                                          int8_t* qx, float2* ds) {
  static_assert(kVec4 || !kQuant, "the quantising epilogue reads float4s");
  using Reduce = cub::BlockReduce<double, kBlock>;
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ float inv_s;
  // The weight's first kPre float4s of this thread are loaded before the
  // wait for x (pdl.cuh): a norm weight is read-only during decode, and its
  // load (likely from HBM: the step's 3 GB weight stream passes through a
  // 60 MB L2 between two reads of it) then overlaps the previous kernel's
  // tail and this one's reduction.
  constexpr int kPre = 2;
  float4 w_pre[kPre];
  if constexpr (kVec4) {
#pragma unroll
    for (int k = 0; k < kPre; ++k) {
      const int i = int(threadIdx.x) + k * kBlock;
      if (i < n / 4) w_pre[k] = reinterpret_cast<const float4*>(w)[i];
    }
  }
  pdl::begin();
  const float* xr = x + size_t(blockIdx.x) * n;
  float* o = out + size_t(blockIdx.x) * n;
  double ss = 0.0;
  if constexpr (kVec4) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    for (int i = threadIdx.x; i < n / 4; i += kBlock) {
      const float4 v = x4[i];
      ss += sq(v.x) + sq(v.y) + sq(v.z) + sq(v.w);
    }
  } else {
    for (int i = threadIdx.x; i < n; i += kBlock) ss += sq(xr[i]);
  }
  const double total = Reduce(tmp).Sum(ss);
  // ops.cpp: float(1.0 / std::sqrt(ss / n + double(eps))); double sqrt and
  // division are correctly rounded on both sides.
  if (threadIdx.x == 0) inv_s = float(1.0 / sqrt(total / n + double(eps)));
  __syncthreads();  // also orders every read of x above before the writes below (out may alias x)
  const float inv = inv_s;
  if constexpr (kVec4) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    const float4* w4 = reinterpret_cast<const float4*>(w);
    float4* o4 = reinterpret_cast<float4*>(o);
    auto f = [inv](float a, float b) { return __fmul_rn(__fmul_rn(a, inv), b); };
    auto apply = [&](int i, float4 wv) {
      const float4 r = apply4(x4[i], wv, f);
      o4[i] = r;
      if constexpr (kQuant) {  // i = 8 * block + g; the 8 lanes of a block are all here (n / 4 % 8 == 0)
        const float v[4] = {r.x, r.y, r.z, r.w};
        const int lane = threadIdx.x & 31;
        qx::quantize_block<4>(v, 0xffu << (lane & 24), i & 7, qx + size_t(blockIdx.x) * n + 32 * (i / 8),
                              ds + size_t(blockIdx.x) * (n / 32) + i / 8);
      }
    };
#pragma unroll
    for (int k = 0; k < kPre; ++k) {
      const int i = int(threadIdx.x) + k * kBlock;
      if (i < n / 4) apply(i, w_pre[k]);
    }
    for (int i = int(threadIdx.x) + kPre * kBlock; i < n / 4; i += kBlock) apply(i, w4[i]);
  } else {
    for (int i = threadIdx.x; i < n; i += kBlock) o[i] = __fmul_rn(__fmul_rn(xr[i], inv), w[i]);
  }
}

// ---- RoPE: one thread per (row, head, pair) -----------------------------------

// x2 (n_heads2 heads) is a second tensor at the same positions (q and k in
// one launch); nullptr for none. Heads [0, n_heads) are x's, the rest x2's.
// A thread per head, not a loop over the heads: a decode step has one row,
// and 128 threads walking 28 heads serially took the step's longest small
// kernel (ncu on the H200, 27B shape, 7e9c6b0). Every thread computes its
// pair's angle (double cos and sin, as ops.cpp): the same bits in each head.
template <bool kHalfSplit>
__global__ void rope_kernel(float* x, int n_heads, float* x2, int n_heads2, int T, int head_dim, const int64_t* pos,
                            const double* freqs, int half) {
  pdl::begin();
  const int heads = n_heads + n_heads2;
  const int64_t work = int64_t(T) * heads * half;
  for (int64_t w = thread_index(); w < work; w += grid_stride()) {
    const int i = int(w % half);
    const int64_t th = w / half;
    const int t = int(th / heads), h = int(th % heads);
    const double angle = double(pos[t]) * freqs[i];
    const float cs = float(cos(angle)), sn = float(sin(angle));
    const int a = kHalfSplit ? i : 2 * i;
    const int b = kHalfSplit ? i + half : 2 * i + 1;
    float* v = h < n_heads ? x + (size_t(t) * n_heads + h) * head_dim
                           : x2 + (size_t(t) * n_heads2 + (h - n_heads)) * head_dim;
    const float x0 = v[a], x1 = v[b];
    v[a] = __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn));
    v[b] = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, cs));
  }
}

template <bool kVec4, bool kQuant>
void launch_rms_norm(const float* x, const float* weight, int T, int n, float eps, float* out, int8_t* qx,
                     float2* ds, cudaStream_t stream) {
  if (norm_threads(n) == kWideNormThreads) {
    pdl::launch("rms_norm kernel launch", rms_norm_kernel<kWideNormThreads, kVec4, kQuant>, T, kWideNormThreads, 0,
                stream, x, weight, n, eps, out, qx, ds);
  } else {
    pdl::launch("rms_norm kernel launch", rms_norm_kernel<kThreads, kVec4, kQuant>, T, kThreads, 0, stream, x,
                weight, n, eps, out, qx, ds);
  }
}

}  // namespace

void rms_norm(const float* x, const float* weight, int T, int n, float eps, float* out, cudaStream_t stream) {
  if (T == 0 || n == 0) return;
  if (n % 4 == 0 && aligned16(x) && aligned16(weight) && aligned16(out)) {
    launch_rms_norm<true, false>(x, weight, T, n, eps, out, nullptr, nullptr, stream);
  } else {
    launch_rms_norm<false, false>(x, weight, T, n, eps, out, nullptr, nullptr, stream);
  }
}

bool rms_norm_quantize(const float* x, const float* weight, int T, int n, float eps, float* out, void* workspace,
                       cudaStream_t stream) {
  if (n % 32 != 0 || !aligned16(x) || !aligned16(weight) || !aligned16(out)) return false;
  if (T == 0 || n == 0) return true;
  const qdot::XQuant xq = qx::xquant_of(workspace, n, T);
  launch_rms_norm<true, true>(x, weight, T, n, eps, out, const_cast<int8_t*>(xq.qx), const_cast<float2*>(xq.ds),
                              stream);
  return true;
}

void rope(float* x, int n_heads, float* x2, int n_heads2, int T, int head_dim, const int64_t* pos,
          const double* freqs, int rope_dim, bool half_split, cudaStream_t stream) {
  const int half = rope_dim / 2;
  if (x2 == nullptr) n_heads2 = 0;
  if (T == 0 || (n_heads == 0 && n_heads2 == 0) || half == 0) return;
  const int grid = grid_for(int64_t(T) * (n_heads + n_heads2) * half);
  pdl::launch("rope kernel launch", half_split ? rope_kernel<true> : rope_kernel<false>, grid, kThreads, 0, stream, x,
              n_heads, x2, n_heads2, T, head_dim, pos, freqs, half);
}

void swiglu(float* gate, const float* up, int64_t n, cudaStream_t stream) {
  launch_binary(gate, up, n, 0, SwiGLUOp{}, stream, "swiglu kernel launch");
}

bool swiglu_quantize(float* gate, const float* up, int T, int n, void* workspace, cudaStream_t stream) {
  if (n % 32 != 0 || !aligned16(gate) || !aligned16(up)) return false;
  const int64_t n4 = int64_t(T) * n / 4;
  if (n4 == 0) return true;
  const qdot::XQuant xq = qx::xquant_of(workspace, n, T);
  pdl::launch("swiglu (quantising) kernel launch", binary_kernel<float4, SwiGLUOp, true>, grid_for(n4), kThreads, 0,
              stream, reinterpret_cast<float4*>(gate), reinterpret_cast<const float4*>(up), n4, int64_t(0),
              SwiGLUOp{}, const_cast<int8_t*>(xq.qx), const_cast<float2*>(xq.ds));
  return true;
}

void geglu_tanh(float* gate, const float* up, int64_t n, cudaStream_t stream) {
  launch_binary(gate, up, n, 0, GeGLUTanhOp{}, stream, "geglu_tanh kernel launch");
}

void add(float* x, const float* y, int64_t n, cudaStream_t stream) {
  launch_binary(x, y, n, 0, AddOp{}, stream, "add kernel launch");
}

void add_bias(float* x, const float* bias, int T, int n, cudaStream_t stream) {
  launch_binary(x, bias, int64_t(T) * n, n, AddOp{}, stream, "add_bias kernel launch");
}

void scale(float* x, float s, int64_t n, cudaStream_t stream) {
  launch_binary(x, nullptr, n, 0, ScaleOp{s}, stream, "scale kernel launch");
}

void f32_to_bf16(const float* x, uint16_t* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (n % 4 == 0 && aligned16(x) && reinterpret_cast<uintptr_t>(out) % 8 == 0) {
    bf16_kernel4<<<grid_for(n / 4), kThreads, 0, stream>>>(reinterpret_cast<const float4*>(x),
                                                          reinterpret_cast<uint2*>(out), n / 4);
  } else {
    bf16_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, out, n);
  }
  check_launch("f32_to_bf16 kernel launch");
}

}  // namespace activekv::cuda::kernels
