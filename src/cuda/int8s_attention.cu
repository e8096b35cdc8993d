// int8s split attention on the GPU, reading the codes in place (SPEC §3.3).
// Contract: include/activekv/cuda/format_kernels.h. CPU reference:
// attention::attend_int8s_tile (same quantisation of the query, same integer
// dot products; the GPU keeps scores in base 2 and sums in a different order,
// so the two agree to fp32 rounding, not bit for bit).
//
// CTA = one split (<= page) x one KV head, 128 threads, tokens in blocks of
// 128 (one token per thread for the scores):
//   prologue  q'_g = q_g * c (channel scales folded in), a_g = max|q'_g| / 127,
//             int8 codes of q'_g (and of the residual on the a_g/127 grid) in
//             shared memory;
//   per block key and value codes of 128 tokens -> shared memory (16-byte
//             cp.async copies, all in flight at once; key rows padded to
//             HD + 16 bytes so that reads of a row are bank-conflict free);
//             score_t = ((dot_hi + dot_lo / 127) * s_t) * a_g * scale * log2 e
//             with exact int32 dot products, on int8 tensor cores
//             (mma.m16n8k32: the 8 heads x 2 query terms are the 16 rows) or
//             with __dp4a (one token per thread); both give the same bits;
//             block max and sum per head by warp butterflies + fixed-order
//             combination of the 4 warps (bitwise repeatable);
//             P.V: thread owns 2 channels for every head, acc += p * code;
//   end       O = acc * v_j / l, LSE = (m + log2 l) ln 2.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "activekv/cuda/format_kernels.h"
#include "int8s_query.cuh"
#include "int8s_score.cuh"
#include "int8s_tc.h"
#include "mma_util.cuh"
#include "activekv/kv/int8s_layout.h"
#include "once_per_device.h"

namespace activekv::cuda {
namespace {

using detail::cp_async16;  // mma_util.cuh
using detail::quantise_int8;  // int8s_query.cuh
using detail::quantise_int8_residual;
using detail::int8s_score;  // int8s_score.cuh
using detail::smem_u32;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kTok = 128;   // tokens per block (one per thread)
constexpr int kHeads = 8;   // max query heads per KV head
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kLog2e = 1.4426950408889634f;

template <int HD> __host__ __device__ constexpr int k_row_bytes() { return HD + 16; }  // padded key row
template <int HD>
constexpr size_t int8s_smem_bytes() {
  return size_t(kTok) * k_row_bytes<HD>()    // key codes
         + size_t(kTok) * HD                  // value codes
         + size_t(2) * kHeads * HD            // query codes, 2 terms
         + size_t(kHeads) * kTok * 4          // scores / probabilities
         + size_t(kTok) * 4                   // token scales
         + size_t(2) * kWarps * kHeads * 4    // block reductions
         + size_t(3) * kHeads * 4;            // row scales, alpha, scratch
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// CUDA cores: thread t takes token t of the block, every head, __dp4a on 4
// codes at a time (key row read as 16-byte chunks, query codes broadcast).
template <int HD>
__device__ __forceinline__ void scores_dp4a(const int8_t* sk, const int8_t* sq, const float* ss,
                                            const float* row_scale, float* sp, int nb, int group, int terms, int tid) {
  constexpr int CH = HD / 16;
  int dhi[kHeads], dlo[kHeads];
#pragma unroll
  for (int g = 0; g < kHeads; ++g) dhi[g] = dlo[g] = 0;
  const int8_t* krow = sk + tid * k_row_bytes<HD>();
#pragma unroll 4
  for (int c = 0; c < CH; ++c) {
    const int4 kw = *reinterpret_cast<const int4*>(krow + c * 16);
#pragma unroll
    for (int g = 0; g < kHeads; ++g) {
      if (g >= group) break;
      const int4 qh = *reinterpret_cast<const int4*>(sq + g * HD + c * 16);
      dhi[g] = __dp4a(kw.x, qh.x, dhi[g]);
      dhi[g] = __dp4a(kw.y, qh.y, dhi[g]);
      dhi[g] = __dp4a(kw.z, qh.z, dhi[g]);
      dhi[g] = __dp4a(kw.w, qh.w, dhi[g]);
      if (terms == 2) {
        const int4 ql = *reinterpret_cast<const int4*>(sq + (kHeads + g) * HD + c * 16);
        dlo[g] = __dp4a(kw.x, ql.x, dlo[g]);
        dlo[g] = __dp4a(kw.y, ql.y, dlo[g]);
        dlo[g] = __dp4a(kw.z, ql.z, dlo[g]);
        dlo[g] = __dp4a(kw.w, ql.w, dlo[g]);
      }
    }
  }
  const bool valid = tid < nb;
#pragma unroll
  for (int g = 0; g < kHeads; ++g) {
    if (g >= group) break;
    sp[g * kTok + tid] = valid ? int8s_score(dhi[g], dlo[g], ss[tid], row_scale[g]) : -INFINITY;
  }
}

// D (16x8 s32) += A (16x32 s8, row) * B (32x8 s8, col): int8 tensor cores, exact int32 sums.
__device__ __forceinline__ void mma_s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Tensor cores: A = the query codes, rows 0..7 the first term of heads 0..7 and
// rows 8..15 the second term (sq's layout), so the two dot products of head g
// land in the same lane (C rows g and g+8); B = 8 key rows. Warp w takes the
// block's tokens [32w, 32w + 32) as 4 tiles of 8. Integer sums are exact, so
// the scores are bitwise those of scores_dp4a. Key rows are padded to HD + 16
// bytes: lanes (g, q) read word q of row g at bank 4g + q, conflict-free.
template <int HD>
__device__ __forceinline__ void scores_mma(const int8_t* sk, const int8_t* sq, const float* ss,
                                           const float* row_scale, float* sp, int nb, int group, int warp, int lane) {
  constexpr int KS = HD / 32;
  const int g = lane >> 2, q4 = lane & 3;
  uint32_t a[KS][4];
#pragma unroll
  for (int k = 0; k < KS; ++k) {
    a[k][0] = *reinterpret_cast<const uint32_t*>(sq + g * HD + 32 * k + 4 * q4);
    a[k][1] = *reinterpret_cast<const uint32_t*>(sq + (kHeads + g) * HD + 32 * k + 4 * q4);
    a[k][2] = *reinterpret_cast<const uint32_t*>(sq + g * HD + 32 * k + 16 + 4 * q4);
    a[k][3] = *reinterpret_cast<const uint32_t*>(sq + (kHeads + g) * HD + 32 * k + 16 + 4 * q4);
  }
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
    const int n0 = warp * 32 + nt * 8;
    const int8_t* krow = sk + (n0 + g) * k_row_bytes<HD>() + 4 * q4;
    int c[4] = {0, 0, 0, 0};
#pragma unroll
    for (int k = 0; k < KS; ++k)
      mma_s8(c, a[k], *reinterpret_cast<const uint32_t*>(krow + 32 * k),
             *reinterpret_cast<const uint32_t*>(krow + 32 * k + 16));
    if (g < group) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int t = n0 + 2 * q4 + j;
        sp[g * kTok + t] = t < nb ? int8s_score(c[j], c[2 + j], ss[t], row_scale[g]) : -INFINITY;
      }
    }
  }
}

template <int HD, bool kMma>
__global__ void __launch_bounds__(kThreads)
int8s_split_kernel(const SplitWork* __restrict__ work, const float* __restrict__ q, float* __restrict__ part_o,
                   float* __restrict__ part_lse, int max_splits, int n_kv, int group, int page_size,
                   float scale_log2, Int8sKernelOptions opt, int head0) {
  constexpr int KR = k_row_bytes<HD>();
  constexpr int CH = HD / 16;  // 16-byte chunks per row
  static_assert(kTok == 32 * kWarps, "scores_mma gives each warp 32 tokens of the block");
  extern __shared__ __align__(16) unsigned char smem[];
  int8_t* sk = reinterpret_cast<int8_t*>(smem);
  int8_t* sv = sk + kTok * KR;
  int8_t* sq = sv + kTok * HD;                                   // [term][head][HD]
  float* sp = reinterpret_cast<float*>(sq + 2 * kHeads * HD);    // [head][kTok]
  float* ss = sp + kHeads * kTok;                                 // [kTok]
  float* red_a = ss + kTok;                                       // [warp][head]
  float* red_b = red_a + kWarps * kHeads;                         // [warp][head]
  float* row_scale = red_b + kWarps * kHeads;                     // [head]
  float* alpha_s = row_scale + kHeads;                            // [head]

  const SplitWork w = work[blockIdx.x];
  const int h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int nq = n_kv * group;
  const kv::Int8sSectionLayout lay{size_t(HD), size_t(page_size)};  // full pages only (the engine checks)
  const unsigned char* base = static_cast<const unsigned char*>(w.page) + lay.head_offset(head0 + h);  // shard: its heads
  const __half* c_scale = reinterpret_cast<const __half*>(base + lay.key_channel_scales());
  const __half* s_scale = reinterpret_cast<const __half*>(base + lay.key_token_scales());
  const int8_t* kq = reinterpret_cast<const int8_t*>(base + lay.key_codes());
  const __half* v_scale = reinterpret_cast<const __half*>(base + lay.value_channel_scales());
  const int8_t* vq = reinterpret_cast<const int8_t*>(base + lay.value_codes());

  // --- prologue: quantise each query head's channel-scaled row -------------
  for (int g = 0; g < group; ++g) {
    const float* qrow = q + (size_t(w.seq) * nq + size_t(h) * group + g) * HD;
    float mx = 0.f;
    for (int j = tid; j < HD; j += kThreads) mx = fmaxf(mx, fabsf(qrow[j] * __half2float(c_scale[j])));
    mx = warp_max(mx);
    if (lane == 0) red_a[warp * kHeads + g] = mx;
  }
  // Rows of heads >= group are read by the tensor-core path (their results are discarded): keep them defined.
  for (int i = group * HD + tid; i < kHeads * HD; i += kThreads) sq[i] = sq[kHeads * HD + i] = 0;
  __syncthreads();
  for (int g = 0; g < group; ++g) {
    float mx = red_a[g];
#pragma unroll
    for (int i = 1; i < kWarps; ++i) mx = fmaxf(mx, red_a[i * kHeads + g]);
    const float a = mx / 127.f;
    const float* qrow = q + (size_t(w.seq) * nq + size_t(h) * group + g) * HD;
    for (int j = tid; j < HD; j += kThreads) {
      const float x = qrow[j] * __half2float(c_scale[j]);
      const int8_t hi = quantise_int8(x, a);
      sq[g * HD + j] = hi;
      sq[(kHeads + g) * HD + j] = opt.query_terms == 2 ? quantise_int8_residual(x, a, hi) : int8_t(0);
    }
    if (tid == 0) row_scale[g] = a * scale_log2;
  }

  float m_run[kHeads], l_run[kHeads];
  float acc[kHeads][2];
#pragma unroll
  for (int g = 0; g < kHeads; ++g) { m_run[g] = -INFINITY; l_run[g] = 0.f; acc[g][0] = acc[g][1] = 0.f; }
  const int pv_ch = 2 * tid;  // this thread's value channels (threads >= HD/2 own none)

  for (int t0 = 0; t0 < w.ntok; t0 += kTok) {
    const int nb = min(kTok, w.ntok - t0);
    __syncthreads();  // previous block fully consumed (and the prologue's smem visible)
    // --- stage key and value codes of the block ---------------------------
    // All 16-byte copies of the block in flight at once (cp.async; rows past
    // the split's end are zero-filled), so the load latency is paid once per
    // block rather than once per chunk.
    for (int i = tid; i < kTok * CH; i += kThreads) {
      const int r = i / CH, c = i % CH;
      const bool ok = r < nb;
      const size_t off = size_t(w.tok0 + t0 + (ok ? r : 0)) * HD + size_t(c) * 16;
      cp_async16(smem_u32(sk + r * KR + c * 16), kq + off, ok ? 16 : 0);
      cp_async16(smem_u32(sv + r * HD + c * 16), vq + off, ok ? 16 : 0);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    if (tid < nb) ss[tid] = __half2float(s_scale[w.tok0 + t0 + tid]);
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();

    // --- scores of every head into sp, then the block max per head --------
    if constexpr (kMma) scores_mma<HD>(sk, sq, ss, row_scale, sp, nb, group, warp, lane);
    else scores_dp4a<HD>(sk, sq, ss, row_scale, sp, nb, group, opt.query_terms, tid);
    __syncthreads();
#pragma unroll
    for (int g = 0; g < kHeads; ++g) {
      if (g >= group) break;
      const float bm = warp_max(sp[g * kTok + tid]);
      if (lane == 0) red_a[warp * kHeads + g] = bm;
    }
    __syncthreads();
    // --- online softmax statistics (every thread computes the same values) --
    bool all_unit = true;
#pragma unroll
    for (int g = 0; g < kHeads; ++g) {
      if (g >= group) break;
      float bm = red_a[g];
#pragma unroll
      for (int i = 1; i < kWarps; ++i) bm = fmaxf(bm, red_a[i * kHeads + g]);
      float mx = fmaxf(m_run[g], bm);
      if (opt.pow2_reference && mx != -INFINITY) mx = ceilf(mx);
      if (opt.pow2_reference) mx = fmaxf(mx, m_run[g]);  // the reference never moves down
      const float alpha = mx == -INFINITY ? 1.f : exp2f(m_run[g] - mx);  // m_run = -inf -> 0
      m_run[g] = mx;
      const float s = sp[g * kTok + tid];
      const float p = mx == -INFINITY ? 0.f : exp2f(s - mx);
      const float ps = warp_sum(p);
      if (lane == 0) red_b[warp * kHeads + g] = ps;
      // p is written back by the same thread that read s: no race.
      sp[g * kTok + tid] = p;
      if (tid == 0) alpha_s[g] = alpha;  // every thread computes the same value
      all_unit = all_unit && alpha == 1.f;
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < kHeads; ++g) {
      if (g >= group) break;
      float bsum = red_b[g];
#pragma unroll
      for (int i = 1; i < kWarps; ++i) bsum += red_b[i * kHeads + g];
      l_run[g] = fmaf(l_run[g], alpha_s[g], bsum);
    }
    // --- P.V on raw value codes --------------------------------------------
    if (pv_ch < HD) {
      if (!(opt.skip_unit_rescale && all_unit)) {
#pragma unroll
        for (int g = 0; g < kHeads; ++g) { acc[g][0] *= alpha_s[g]; acc[g][1] *= alpha_s[g]; }
      }
      for (int t = 0; t < nb; ++t) {
        const char2 v2 = *reinterpret_cast<const char2*>(sv + t * HD + pv_ch);
        const float v0 = float(v2.x), v1 = float(v2.y);
#pragma unroll
        for (int g = 0; g < kHeads; ++g) {
          if (g >= group) break;
          const float p = sp[g * kTok + t];
          acc[g][0] = fmaf(p, v0, acc[g][0]);
          acc[g][1] = fmaf(p, v1, acc[g][1]);
        }
      }
    }
  }

  // --- write the partial -------------------------------------------------
  const size_t out_base = (size_t(w.seq) * max_splits + w.split) * nq + size_t(h) * group;
  if (pv_ch < HD) {
    const float vs0 = __half2float(v_scale[pv_ch]), vs1 = __half2float(v_scale[pv_ch + 1]);
#pragma unroll
    for (int g = 0; g < kHeads; ++g) {
      if (g >= group) break;
      const bool empty = m_run[g] == -INFINITY || !(l_run[g] > 0.f);
      float* o = part_o + (out_base + g) * HD + pv_ch;
      o[0] = empty ? 0.f : (acc[g][0] * vs0) / l_run[g];
      o[1] = empty ? 0.f : (acc[g][1] * vs1) / l_run[g];
      if (tid == 0) part_lse[out_base + g] = empty ? -INFINITY : (m_run[g] + log2f(l_run[g])) * kLn2;
    }
  }
}

template <int HD, bool kMma>
void launch(const AttnShape& sh, const SplitWork* work, int n_work, const float* q, Partials p, float sl2,
            const Int8sKernelOptions& opt, cudaStream_t st) {
  constexpr size_t smem = int8s_smem_bytes<HD>();
  // Over the 48 KiB default: raised per device and instantiation (OncePerDevice).
  static OncePerDevice smem_limit_set;
  smem_limit_set([] {
    check_cuda(cudaFuncSetAttribute(int8s_split_kernel<HD, kMma>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(smem)),
               "cudaFuncSetAttribute(int8s_split_kernel)");
  });
  int8s_split_kernel<HD, kMma><<<dim3(n_work, sh.n_kv_heads), kThreads, smem, st>>>(
      work, q, p.o, p.lse, p.max_splits, sh.n_kv_heads, sh.group, sh.page_size, sl2, opt, sh.kv_head0);
}

template <int HD>
void launch(const AttnShape& sh, const SplitWork* work, int n_work, const float* q, Partials p, float sl2,
            const Int8sKernelOptions& opt, cudaStream_t st) {
  if (opt.tensor_cores) launch<HD, true>(sh, work, n_work, q, p, sl2, opt, st);
  else launch<HD, false>(sh, work, n_work, q, p, sl2, opt, st);
}

}  // namespace

Int8sKernel parse_int8s_kernel(const std::string& name) {
  if (name == "legacy") return Int8sKernel::legacy;
  if (name == "tc") return Int8sKernel::tc;
  if (name == "auto") return Int8sKernel::automatic;
  throw InvalidArgument("int8s kernel must be tc, legacy or auto, got '" + name + "'");
}

const char* int8s_kernel_name(Int8sKernel k) {
  return k == Int8sKernel::tc ? "tc" : k == Int8sKernel::legacy ? "legacy" : "auto";
}

Int8sKernel resolve_int8s_kernel(Int8sKernel k, const AttnShape& shape) {
  if (k != Int8sKernel::automatic) return k;
  return int8s_tc_supports_group(shape.group) && shape.split_tokens <= 4096 ? Int8sKernel::tc : Int8sKernel::legacy;
}

void launch_split_attention_int8s(const AttnShape& shape, const SplitWork* work, int n_work, const float* q,
                                  Partials partials, const Int8sKernelOptions& opt, cudaStream_t stream) {
  if (n_work < 0) throw InvalidArgument("launch_split_attention_int8s: n_work is " + std::to_string(n_work));
  if (n_work == 0) return;  // jobs without int8s pages: no requirement on the shape applies
  shape.validate();
  if (shape.page_size % 16 != 0)
    throw InvalidArgument("int8s attention: page_size must be a multiple of 16, got " + std::to_string(shape.page_size));
  if (shape.head_dim != 64 && shape.head_dim != 256)  // AttnShape also admits 128 (bf16 kernels only)
    throw InvalidArgument("int8s attention: head_dim must be 64 or 256, got " + std::to_string(shape.head_dim));
  if (opt.query_terms != 1 && opt.query_terms != 2)
    throw InvalidArgument("int8s attention: query_terms must be 1 or 2, got " + std::to_string(opt.query_terms));
  const float scale = shape.softmax_scale > 0.f ? shape.softmax_scale : 1.f / std::sqrt(float(shape.head_dim));
  const float sl2 = scale * kLog2e;
  if (resolve_int8s_kernel(opt.kernel, shape) == Int8sKernel::tc)
    return launch_split_attention_int8s_tc(shape, work, n_work, q, partials, opt, sl2, stream);
  if (shape.head_dim == 256) launch<256>(shape, work, n_work, q, partials, sl2, opt, stream);
  else launch<64>(shape, work, n_work, q, partials, sl2, opt, stream);
  check_cuda(cudaGetLastError(), "int8s_split_kernel launch");
}

}  // namespace activekv::cuda
