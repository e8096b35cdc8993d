// Device building blocks shared by the tensor-core attention kernels
// (decode_attention.cu, prefill_attention.cu, int8s_attention.cu): 16-byte
// async copies, ldmatrix, mma.sync m16n8k16 bf16 with fp32 accumulation, and
// the split of fp32 values into bf16 terms. Internal header (src/cuda only).
//
// Fragment layouts of mma.m16n8k16 (PTX ISA, "Matrix Fragments for
// mma.m16n8k16"), lane = 4 * g + q4 (g = lane >> 2 "group", q4 = lane & 3):
//   A (16x16, row-major), 4 x b32 = 8 bf16:  a[0] = (row g,   cols 2q4, 2q4+1)
//                                             a[1] = (row g+8, cols 2q4, 2q4+1)
//                                             a[2] = (row g,   cols 2q4+8, +9)
//                                             a[3] = (row g+8, cols 2q4+8, +9)
//   B (16x8, "col"), 2 x b32:                 b0 = (k 2q4, 2q4+1; n g), b1 = (k 2q4+8, +9; n g)
//   C/D (16x8 fp32), 4 floats:                d[0], d[1] = (row g, cols 2q4, 2q4+1)
//                                             d[2], d[3] = (row g+8, cols 2q4, 2q4+1)
// ldmatrix .x4: lanes 8i..8i+7 give the 16-byte row addresses of matrix i; lane
// T receives (row T/4, elements 2(T%4), +1) of each matrix -- with .trans the
// transpose, (rows 2(T%4), +1 of element column T/4).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace activekv::cuda::detail {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16-byte async copy; src_bytes = 0 zero-fills the destination (rows past the end).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
// 16-byte async copy from [src + SRC] to [dst + DST]: the offsets are
// immediates of the instruction, so a run of copies from one base address
// costs no address arithmetic each.
template <int DST, int SRC>
__device__ __forceinline__ void cp_async16_at(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0+%2], [%1+%3], 16;\n" ::"r"(dst), "l"(src), "n"(DST), "n"(SRC) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
// D += A (16x16 bf16, rows 8..15 zero) * B (16x8 bf16), fp32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}
// D += A (16x16 bf16, a[0..3] as above) * B (16x8 bf16), fp32 accumulate.
__device__ __forceinline__ void mma_bf16_full(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
// Splits the fp32 pair (x0, x1) into N bf16 pairs, largest first, that sum to
// x to ~8N significant bits: each residual x - (terms so far) is exact in fp32,
// so the relative error after N terms is at most 2^-8N (bf16 unit roundoff
// 2^-8 per term). Products with exact bf16 K/V on the tensor cores then carry
// that error only: N = 3 is fp32-accurate, N = 2 ~16 bits, N = 1 plain bf16.
template <int N>
__device__ __forceinline__ void split_bf16(float x0, float x1, uint32_t (&o)[N]) {
  static_assert(N >= 1 && N <= 3, "1..3 bf16 terms");
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const __nv_bfloat162 t = __floats2bfloat162_rn(x0, x1);
    o[i] = *reinterpret_cast<const uint32_t*>(&t);
    if (i + 1 < N) {
      const float2 tf = __bfloat1622float2(t);
      x0 -= tf.x;
      x1 -= tf.y;
    }
  }
}
// Three terms (hi, mid, lo): fp32-accurate products with exact bf16 operands.
__device__ __forceinline__ void split3(float x0, float x1, uint32_t (&o)[3]) { split_bf16<3>(x0, x1, o); }

// Max over the 4 lanes of a quad: the lanes that hold one row of an m16n8
// C fragment (lanes 4g .. 4g + 3).
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// One 16-token block of an online softmax in base 2, for the score row this
// lane's quad holds: s = this lane's 4 scores of the block (-inf where
// masked). Moves the running max m_run to include the block's -- with
// `pow2_reference` (SPEC §4 trick 2) rounded up to an integer and never
// down --, writes p = 2^(s - m_run), folds this lane's p into l_run (its own
// columns; the caller sums the quad at the end) after scaling it, and
// returns alpha = 2^(m_old - m_new), the factor the output accumulators
// take. While every score so far is -inf: alpha 1, p 0.
__device__ __forceinline__ float online_softmax_block(const float (&s)[2][2], float& m_run, float& l_run,
                                                      float (&p)[2][2], bool pow2_reference = false) {
  const float bm = quad_max(fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1])));
  float mx = fmaxf(m_run, bm);
  if (pow2_reference) {
    if (mx != -INFINITY) mx = ceilf(mx);
    mx = fmaxf(mx, m_run);  // the reference never moves down
  }
  const bool none = mx == -INFINITY;
  const float alpha = none ? 1.f : exp2f(m_run - mx);  // m_run = -inf -> 0
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int j = 0; j < 2; ++j) p[nt][j] = none ? 0.f : exp2f(s[nt][j] - mx);
  l_run = fmaf(l_run, alpha, (p[0][0] + p[0][1]) + (p[1][0] + p[1][1]));
  m_run = mx;
  return alpha;
}

}  // namespace activekv::cuda::detail
