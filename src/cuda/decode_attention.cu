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

__device__ __forceinline__ void cp_async_row(void* smem_dst, const void* gmem_src, int bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  if (bytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem_src) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem_src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

constexpr int kStages = 4;  // cp.async pipeline depth per warp (kUnroll rows of K and V per stage)

template <int HD>
constexpr size_t ring_bytes() { return size_t(kWarps) * kStages * kUnroll * 2 * HD * 2; }
template <int HD, int G>
constexpr size_t split_smem_bytes() {
  const size_t merge = size_t(kWarps) * G * HD * 4 + 2 * size_t(kWarps) * G * 4;
  return ring_bytes<HD>() > merge ? ring_bytes<HD>() : merge;
}

// G: largest group this instantiation serves (runtime `group` <= G, masked);
// GP: power of two >= G used by the warp transpose-reduce.
template <int HD, int G, int GP>
__global__ void __launch_bounds__(kThreads)
split_attention_kernel(const SplitWork* __restrict__ work, const float* __restrict__ q,
                       float* __restrict__ part_o, float* __restrict__ part_lse, int max_splits,
                       int n_kv, int group, int page_size, float scale_log2) {
  constexpr int C = HD / 32;
  extern __shared__ __align__(16) unsigned char smem[];
  const SplitWork w = work[blockIdx.x];
  const int h = blockIdx.y;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int nq = n_kv * group;

  const uint16_t* kp = static_cast<const uint16_t*>(w.page) + (size_t(h) * page_size + w.tok0) * HD + lane * C;
  const uint16_t* vp = kp + size_t(n_kv) * page_size * HD;
  // This warp's ring: stage st holds K rows [st][0..U) then V rows [st][U..2U), HD bf16 each.
  uint16_t* ring = reinterpret_cast<uint16_t*>(smem) + size_t(warp) * kStages * kUnroll * 2 * HD + lane * C;
  const int first = warp * kUnroll;
  const int n_it = w.ntok > first ? (w.ntok - first + kWarps * kUnroll - 1) / (kWarps * kUnroll) : 0;
  // Each lane copies (and later reads back) only its own C channels of every
  // row, so the lane's own cp.async.wait_group is all the ordering needed.
  auto issue = [&](int it) {
    const int st = it % kStages;
    const int t0 = first + it * kWarps * kUnroll;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (t0 + u < w.ntok) {
        cp_async_row(ring + (size_t(st) * 2 * kUnroll + u) * HD, kp + size_t(t0 + u) * HD, 2 * C);
        cp_async_row(ring + (size_t(st) * 2 * kUnroll + kUnroll + u) * HD, vp + size_t(t0 + u) * HD, 2 * C);
      }
    }
  };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < n_it) issue(i);
    cp_async_commit();
  }

  float qr[G][C];
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int c = 0; c < C; ++c)
      qr[g][c] = g < group ? q[(size_t(w.seq) * nq + h * group + g) * HD + lane * C + c] * scale_log2 : 0.f;
  }
  float m[G], l[G], acc[G][C];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int c = 0; c < C; ++c) acc[g][c] = 0.f;
  }

  for (int it = 0; it < n_it; ++it) {
    if (it + kStages - 1 < n_it) issue(it + kStages - 1);
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    const int st = it % kStages;
    const int t0 = first + it * kWarps * kUnroll;
    const int nvalid = min(kUnroll, w.ntok - t0);
    const uint16_t* kst = ring + size_t(st) * 2 * kUnroll * HD;
    const uint16_t* vst = kst + size_t(kUnroll) * HD;
    float s[kUnroll][GP];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float kf[C];
      if (u < nvalid) {
        RowVec<C> r;
        if constexpr (C == 8) r.v = *reinterpret_cast<const uint4*>(kst + u * HD);
        else r.v = *reinterpret_cast<const unsigned int*>(kst + u * HD);
        r.to_float(kf);
      } else {
#pragma unroll
        for (int c = 0; c < C; ++c) kf[c] = 0.f;
      }
      float part[GP];
#pragma unroll
      for (int g = 0; g < GP; ++g) {
        float d = 0.f;
        if (g < G) {
#pragma unroll
          for (int c = 0; c < C; ++c) d = fmaf(qr[g < G ? g : 0][c], kf[c], d);
        }
        part[g] = d;
      }
      warp_reduce_heads<GP>(part, s[u], lane);
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
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
        RowVec<C> r;
        if constexpr (C == 8) r.v = *reinterpret_cast<const uint4*>(vst + u * HD);
        else r.v = *reinterpret_cast<const unsigned int*>(vst + u * HD);
        r.to_float(vf);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const float p = exp2f(s[u][g] - m[g]);
          l[g] += p;
#pragma unroll
          for (int c = 0; c < C; ++c) acc[g][c] = fmaf(p, vf[c], acc[g][c]);
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the merge area below aliases every warp's ring

  // Merge the warps' states in fixed order (warp 0, 1, 2, 3).
  float* sm_acc = reinterpret_cast<float*>(smem);           // [kWarps][G][HD]
  float* sm_m = sm_acc + size_t(kWarps) * G * HD;           // [kWarps][G]
  float* sm_l = sm_m + kWarps * G;                          // [kWarps][G]
  if (lane == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g) { sm_m[warp * G + g] = m[g]; sm_l[warp * G + g] = l[g]; }
  }
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int c = 0; c < C; ++c) sm_acc[(size_t(warp) * G + g) * HD + lane * C + c] = acc[g][c];
  __syncthreads();

  const size_t base = (size_t(w.seq) * max_splits + w.split) * nq + size_t(h) * group;
  for (int idx = threadIdx.x; idx < group * HD; idx += kThreads) {
    const int g = idx / HD, c = idx % HD;
    float M = -INFINITY;
#pragma unroll
    for (int i = 0; i < kWarps; ++i) M = fmaxf(M, sm_m[i * G + g]);
    float L = 0.f, O = 0.f;
    if (M != -INFINITY) {
#pragma unroll
      for (int i = 0; i < kWarps; ++i) {
        const float mi = sm_m[i * G + g];
        if (mi == -INFINITY) continue;
        const float sc = exp2f(mi - M);
        L = fmaf(sc, sm_l[i * G + g], L);
        O = fmaf(sc, sm_acc[(size_t(i) * G + g) * HD + c], O);
      }
    }
    part_o[(base + g) * HD + c] = M == -INFINITY ? 0.f : O / L;
    if (c == 0) part_lse[base + g] = M == -INFINITY ? -INFINITY : (M + log2f(L)) * kLn2;
  }
}

// Merge: grid (n_seq, n_q_heads, HD / 64), 64 threads (one channel each).
// Weights exp(LSE_j - M) are computed once per CTA into shared memory; every
// thread then sums them in ascending order (same bits everywhere) and
// accumulates its channel, skipping empty partials (weight 0: O never read).
constexpr int kMergeThreads = 64;
__global__ void __launch_bounds__(kMergeThreads)
merge_kernel(const float* __restrict__ part_o, const float* __restrict__ part_lse, int max_splits,
             const int32_t* __restrict__ n_splits, int nq, int hd, float* __restrict__ out,
             float* __restrict__ out_lse) {
  extern __shared__ float wts[];  // [max_splits]
  __shared__ float red[kMergeThreads / 32];
  const int s = blockIdx.x, h = blockIdx.y, c = blockIdx.z * kMergeThreads + threadIdx.x;
  const int n = n_splits[s];
  const float* lse = part_lse + size_t(s) * max_splits * nq + h;
  float M = -INFINITY;
  for (int j = threadIdx.x; j < n; j += kMergeThreads) M = fmaxf(M, lse[size_t(j) * nq]);
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = M;
  __syncthreads();
  M = red[0];
#pragma unroll
  for (int i = 1; i < kMergeThreads / 32; ++i) M = fmaxf(M, red[i]);
  for (int j = threadIdx.x; j < n; j += kMergeThreads) {
    const float lj = lse[size_t(j) * nq];
    wts[j] = (lj == -INFINITY || M == -INFINITY) ? 0.f : expf(lj - M);
  }
  __syncthreads();
  float L = 0.f, O = 0.f;
  const float* o = part_o + (size_t(s) * max_splits * nq + h) * hd + c;
#pragma unroll 8
  for (int j = 0; j < n; ++j) {
    const float wj = wts[j];
    const float oj = wj != 0.f ? __ldg(o + size_t(j) * nq * hd) : 0.f;
    L += wj;
    O = fmaf(wj, oj, O);
  }
  const bool empty = !(L > 0.f);
  out[(size_t(s) * nq + h) * hd + c] = empty ? 0.f : O / L;
  if (out_lse && c == 0) out_lse[size_t(s) * nq + h] = empty ? -INFINITY : M + logf(L);
}

template <int HD, int G, int GP>
void launch_split(const AttnShape& sh, const SplitWork* work, int n_work, const float* q,
                  Partials p, float scale_log2, cudaStream_t st) {
  constexpr size_t smem = split_smem_bytes<HD, G>();
  static bool configured = false;  // per instantiation (and device 0; set again harmlessly per process)
  if (!configured) {
    check_cuda(cudaFuncSetAttribute(split_attention_kernel<HD, G, GP>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
               "cudaFuncSetAttribute(split_attention_kernel)");
    configured = true;
  }
  dim3 grid(n_work, sh.n_kv_heads);
  split_attention_kernel<HD, G, GP><<<grid, kThreads, smem, st>>>(
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
  const int g = shape.group;
  if (shape.head_dim == 256) {
    if (g <= 4) launch_split<256, 4, 4>(shape, work, n_work, q, partials, sl2, stream);
    else if (g <= 6) launch_split<256, 6, 8>(shape, work, n_work, q, partials, sl2, stream);
    else launch_split<256, 8, 8>(shape, work, n_work, q, partials, sl2, stream);
  } else {
    if (g <= 4) launch_split<64, 4, 4>(shape, work, n_work, q, partials, sl2, stream);
    else launch_split<64, 8, 8>(shape, work, n_work, q, partials, sl2, stream);
  }
  check_cuda(cudaGetLastError(), "split_attention_kernel launch");
}

void launch_merge(const AttnShape& shape, Partials partials, const int32_t* n_splits, int n_seq,
                  float* out, float* out_lse, cudaStream_t stream) {
  shape.validate();
  if (n_seq <= 0) return;
  if (partials.max_splits <= 0 || partials.max_splits > 12288)
    throw InvalidArgument("launch_merge: max_splits must be 1..12288, got " + std::to_string(partials.max_splits));
  dim3 grid(n_seq, shape.n_q_heads(), shape.head_dim / kMergeThreads);
  merge_kernel<<<grid, kMergeThreads, size_t(partials.max_splits) * sizeof(float), stream>>>(
      partials.o, partials.lse, partials.max_splits, n_splits, shape.n_q_heads(), shape.head_dim, out, out_lse);
  check_cuda(cudaGetLastError(), "merge_kernel launch");
}

}  // namespace activekv::cuda
