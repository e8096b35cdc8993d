// Paged BF16 decode attention (split kernel) and the SPEC §4 merge.
// See include/activekv/cuda/decode_attention.h for the contract.
//
// Split kernel: 128 threads = 4 warps per CTA; lane i owns channels
// [i*C, i*C + C) of the head (C = head_dim / 32: one 16-byte load per token row
// for head_dim 256), so every K/V row is one coalesced 512-byte warp load, read
// once for all `group` query heads. Warp w takes tokens w*U.., stepping 4*U
// (U = 4 rows in flight per operand). The per-head dot products are reduced
// across the warp with a transpose-reduce (GMAX/2 + GMAX/4 + ... shuffles, then
// a butterfly on one value, then GMAX broadcasts) instead of GMAX full
// butterflies. Online softmax in base 2 per warp; the 4 warp states merge in
// shared memory in fixed order. All reductions have a fixed order: outputs are
// bitwise repeatable.
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "activekv/cuda/decode_attention.h"

namespace activekv::cuda {

void check_cuda(int status, const char* what) {
  if (status != cudaSuccess) {
    throw CudaError(std::string(what) + ": " +
                    cudaGetErrorString(static_cast<cudaError_t>(status)));
  }
}

void AttnShape::validate() const {
  auto bad = [](const std::string& m) { throw InvalidArgument("AttnShape: " + m); };
  if (n_kv_heads <= 0) bad("n_kv_heads must be positive, got " + std::to_string(n_kv_heads));
  if (group < 1 || group > 8) bad("group (query heads per KV head) must be 1..8, got " + std::to_string(group));
  if (head_dim != 64 && head_dim != 256) bad("head_dim must be 64 or 256, got " + std::to_string(head_dim));
  if (page_size <= 0) bad("page_size must be positive, got " + std::to_string(page_size));
  if (split_tokens <= 0 || page_size % split_tokens != 0)
    bad("split_tokens must divide page_size (" + std::to_string(page_size) + "), got " +
        std::to_string(split_tokens));
  if (!(softmax_scale >= 0.f) || std::isinf(softmax_scale)) bad("softmax_scale must be finite and >= 0");
}

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 4;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int C> struct RowVec;
template <> struct RowVec<8> {
  uint4 v;
  __device__ static RowVec load(const uint16_t* p) {
    RowVec r; r.v = __ldg(reinterpret_cast<const uint4*>(p)); return r;
  }
  __device__ void to_float(float* f) const {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
};
template <> struct RowVec<2> {
  uint32_t v;
  __device__ static RowVec load(const uint16_t* p) {
    RowVec r; r.v = __ldg(reinterpret_cast<const unsigned int*>(p)); return r;
  }
  __device__ void to_float(float* f) const {
    f[0] = __uint_as_float(v << 16);
    f[1] = __uint_as_float(v & 0xffff0000u);
  }
};

__host__ __device__ constexpr int ilog2(int x) { return x <= 1 ? 0 : 1 + ilog2(x / 2); }

// Reduces v[0..GMAX) (one partial per head in every lane) across the warp;
// returns the full sums, identical in every lane, in s[0..GMAX).
template <int GMAX>
__device__ __forceinline__ void warp_reduce_heads(float (&v)[GMAX], float (&s)[GMAX], int lane) {
  constexpr int K = ilog2(GMAX);
#pragma unroll
  for (int st = 0; st < K; ++st) {
    const int half = GMAX >> (st + 1);
    const int mask = 16 >> st;
    const bool upper = (lane & mask) != 0;
#pragma unroll
    for (int j = 0; j < half; ++j) {
      const float send = upper ? v[j] : v[j + half];
      const float keep = upper ? v[j + half] : v[j];
      v[j] = keep + __shfl_xor_sync(0xffffffffu, send, mask);
    }
  }
#pragma unroll
  for (int mask = 16 >> K; mask >= 1; mask >>= 1) v[0] += __shfl_xor_sync(0xffffffffu, v[0], mask);
  // lane L now holds the sum of head (L >> (5 - K)) & (GMAX - 1)
#pragma unroll
  for (int g = 0; g < GMAX; ++g) s[g] = __shfl_sync(0xffffffffu, v[0], g << (5 - K));
}

template <int HD, int GMAX>
__global__ void __launch_bounds__(kThreads)
split_attention_kernel(const SplitWork* __restrict__ work, const float* __restrict__ q,
                       float* __restrict__ part_o, float* __restrict__ part_lse, int max_splits,
                       int n_kv, int group, int page_size, float scale_log2) {
  constexpr int C = HD / 32;
  const SplitWork w = work[blockIdx.x];
  const int h = blockIdx.y;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int nq = n_kv * group;

  float qr[GMAX][C];
#pragma unroll
  for (int g = 0; g < GMAX; ++g) {
#pragma unroll
    for (int c = 0; c < C; ++c)
      qr[g][c] = g < group ? q[(size_t(w.seq) * nq + h * group + g) * HD + lane * C + c] * scale_log2 : 0.f;
  }
  const uint16_t* kp = static_cast<const uint16_t*>(w.page) + (size_t(h) * page_size + w.tok0) * HD + lane * C;
  const uint16_t* vp = kp + size_t(n_kv) * page_size * HD;

  float m[GMAX], l[GMAX], acc[GMAX][C];
#pragma unroll
  for (int g = 0; g < GMAX; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int c = 0; c < C; ++c) acc[g][c] = 0.f;
  }

  for (int t0 = warp * kUnroll; t0 < w.ntok; t0 += kWarps * kUnroll) {
    RowVec<C> kr[kUnroll], vr[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (t0 + u < w.ntok) {
        kr[u] = RowVec<C>::load(kp + size_t(t0 + u) * HD);
        vr[u] = RowVec<C>::load(vp + size_t(t0 + u) * HD);
      }
    }
    float s[kUnroll][GMAX];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float kf[C];
      if (t0 + u < w.ntok) kr[u].to_float(kf);
      else {
#pragma unroll
        for (int c = 0; c < C; ++c) kf[c] = 0.f;
      }
      float part[GMAX];
#pragma unroll
      for (int g = 0; g < GMAX; ++g) {
        float d = 0.f;
#pragma unroll
        for (int c = 0; c < C; ++c) d = fmaf(qr[g][c], kf[c], d);
        part[g] = d;
      }
      warp_reduce_heads<GMAX>(part, s[u], lane);
    }
    const int nvalid = min(kUnroll, w.ntok - t0);
#pragma unroll
    for (int g = 0; g < GMAX; ++g) {
      float mx = m[g];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (u < nvalid) mx = fmaxf(mx, s[u][g]);
      const float alpha = exp2f(m[g] - mx);  // m = -inf -> 0
      l[g] *= alpha;
#pragma unroll
      for (int c = 0; c < C; ++c) acc[g][c] *= alpha;
      m[g] = mx;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (u < nvalid) {
        float vf[C];
        vr[u].to_float(vf);
#pragma unroll
        for (int g = 0; g < GMAX; ++g) {
          const float p = exp2f(s[u][g] - m[g]);
          l[g] += p;
#pragma unroll
          for (int c = 0; c < C; ++c) acc[g][c] = fmaf(p, vf[c], acc[g][c]);
        }
      }
    }
  }

  // Merge the warps' states in fixed order (warp 0, 1, 2, 3).
  __shared__ float sm_m[kWarps][GMAX];
  __shared__ float sm_l[kWarps][GMAX];
  __shared__ float sm_acc[kWarps][GMAX][HD];
  if (lane == 0) {
#pragma unroll
    for (int g = 0; g < GMAX; ++g) { sm_m[warp][g] = m[g]; sm_l[warp][g] = l[g]; }
  }
#pragma unroll
  for (int g = 0; g < GMAX; ++g)
#pragma unroll
    for (int c = 0; c < C; ++c) sm_acc[warp][g][lane * C + c] = acc[g][c];
  __syncthreads();

  const size_t base = (size_t(w.seq) * max_splits + w.split) * nq + size_t(h) * group;
  for (int idx = threadIdx.x; idx < group * HD; idx += kThreads) {
    const int g = idx / HD, c = idx % HD;
    float M = -INFINITY;
#pragma unroll
    for (int i = 0; i < kWarps; ++i) M = fmaxf(M, sm_m[i][g]);
    float L = 0.f, O = 0.f;
    if (M != -INFINITY) {
#pragma unroll
      for (int i = 0; i < kWarps; ++i) {
        if (sm_m[i][g] == -INFINITY) continue;
        const float sc = exp2f(sm_m[i][g] - M);
        L = fmaf(sc, sm_l[i][g], L);
        O = fmaf(sc, sm_acc[i][g][c], O);
      }
    }
    part_o[(base + g) * HD + c] = M == -INFINITY ? 0.f : O / L;
    if (c == 0) part_lse[base + g] = M == -INFINITY ? -INFINITY : (M + log2f(L)) * kLn2;
  }
}

template <int HD>
__global__ void __launch_bounds__(HD)
merge_kernel(const float* __restrict__ part_o, const float* __restrict__ part_lse, int max_splits,
             const int32_t* __restrict__ n_splits, int nq, float* __restrict__ out,
             float* __restrict__ out_lse) {
  const int s = blockIdx.x, h = blockIdx.y, c = threadIdx.x;
  const int n = n_splits[s];
  const float* lse = part_lse + size_t(s) * max_splits * nq + h;
  const float* o = part_o + (size_t(s) * max_splits * nq + h) * HD + c;
  float M = -INFINITY;
  for (int j = 0; j < n; ++j) M = fmaxf(M, lse[size_t(j) * nq]);
  float L = 0.f, O = 0.f;
  if (M != -INFINITY) {
#pragma unroll 8
    for (int j = 0; j < n; ++j) {
      const float lj = lse[size_t(j) * nq];
      if (lj == -INFINITY) continue;  // empty partial: never read its O
      const float wgt = expf(lj - M);
      L += wgt;
      O = fmaf(wgt, o[size_t(j) * nq * HD], O);
    }
  }
  out[(size_t(s) * nq + h) * HD + c] = M == -INFINITY ? 0.f : O / L;
  if (out_lse && c == 0) out_lse[size_t(s) * nq + h] = M == -INFINITY ? -INFINITY : M + logf(L);
}

template <int HD, int GMAX>
void launch_split(const AttnShape& sh, const SplitWork* work, int n_work, const float* q,
                  Partials p, float scale_log2, cudaStream_t st) {
  dim3 grid(n_work, sh.n_kv_heads);
  split_attention_kernel<HD, GMAX><<<grid, kThreads, 0, st>>>(
      work, q, p.o, p.lse, p.max_splits, sh.n_kv_heads, sh.group, sh.page_size, scale_log2);
}

}  // namespace

void launch_split_attention(const AttnShape& shape, const SplitWork* work, int n_work,
                            const float* q, Partials partials, cudaStream_t stream) {
  shape.validate();
  if (n_work < 0) throw InvalidArgument("launch_split_attention: n_work < 0");
  if (n_work == 0) return;
  const float scale = shape.softmax_scale > 0.f ? shape.softmax_scale
                                                : 1.f / std::sqrt(float(shape.head_dim));
  const float sl2 = scale * kLog2e;
  const bool small = shape.group <= 4;
  if (shape.head_dim == 256) {
    if (small) launch_split<256, 4>(shape, work, n_work, q, partials, sl2, stream);
    else launch_split<256, 8>(shape, work, n_work, q, partials, sl2, stream);
  } else {
    if (small) launch_split<64, 4>(shape, work, n_work, q, partials, sl2, stream);
    else launch_split<64, 8>(shape, work, n_work, q, partials, sl2, stream);
  }
  check_cuda(cudaGetLastError(), "split_attention_kernel launch");
}

void launch_merge(const AttnShape& shape, Partials partials, const int32_t* n_splits, int n_seq,
                  float* out, float* out_lse, cudaStream_t stream) {
  shape.validate();
  if (n_seq <= 0) return;
  dim3 grid(n_seq, shape.n_q_heads());
  if (shape.head_dim == 256)
    merge_kernel<256><<<grid, 256, 0, stream>>>(partials.o, partials.lse, partials.max_splits,
                                                n_splits, shape.n_q_heads(), out, out_lse);
  else
    merge_kernel<64><<<grid, 64, 0, stream>>>(partials.o, partials.lse, partials.max_splits,
                                              n_splits, shape.n_q_heads(), out, out_lse);
  check_cuda(cudaGetLastError(), "merge_kernel launch");
}

}  // namespace activekv::cuda
