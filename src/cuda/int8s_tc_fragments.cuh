// Tensor-core fragments of the int8s decode kernel (int8s_tc_attention.cu):
// one warp, one block of 16 tokens, the group's query heads in the mma rows.
// Internal header (src/cuda only); tested on its own by
// tests/cuda/test_int8s_tc.cpp through int8s_tc_selftest.cu, so a layout
// mistake shows up as a focused failure, not as a wrong attention output.
//
// Notation: lane = 4 g + q4 (g = lane >> 2, q4 = lane & 3).
//
// PTX ISA fragment layouts relied on ("Matrix Fragments for mma.m16n8k32" with
// .s8, and "... for mma.m16n8k16" with .f16):
//   m16n8k32 .s8 (int32 accumulate; exact):
//     A 16x32 row, 4 x b32 of 4 s8:  a0 = (row g,   cols 4q4..4q4+3)
//                                    a1 = (row g+8, cols 4q4..4q4+3)
//                                    a2 = (row g,   cols 16+4q4..16+4q4+3)
//                                    a3 = (row g+8, cols 16+4q4..16+4q4+3)
//     B 32x8 col, 2 x b32 of 4 s8:   b0 = (rows 4q4..4q4+3, col g), b1 = (rows 16+4q4..+3, col g)
//     C/D 16x8 s32:                  c0, c1 = (row g, cols 2q4, 2q4+1); c2, c3 = (row g+8, same cols)
//   m16n8k16 .f16 (fp32 accumulate):
//     A 16x16 row, 4 x b32 of 2 f16: a0 = (row g, cols 2q4, 2q4+1)   a1 = (row g+8, cols 2q4, 2q4+1)
//                                    a2 = (row g, cols 2q4+8, +9)    a3 = (row g+8, cols 2q4+8, +9)
//     B 16x8 col, 2 x b32 of 2 f16:  b0 = (rows 2q4, 2q4+1, col g), b1 = (rows 2q4+8, +9, col g)
//     C/D 16x8 f32:                  as for .s8
//   (the lower column / row index is the low half of a b32 register.)
//   ldmatrix.m8n8.x4.b16: lanes 8i..8i+7 give the addresses of the 8 rows
//     (16 bytes each) of matrix i; register i of lane T = (row T/4, 16-bit
//     elements 2(T%4), 2(T%4)+1) of matrix i, i.e. bytes 4(T%4)..4(T%4)+3 of
//     row T/4. With .trans: (element column T/4 of rows 2(T%4) [low half] and
//     2(T%4)+1 [high half]), i.e. bytes 2(T/4), 2(T/4)+1 of row 2(T%4), then
//     of row 2(T%4)+1.
//
// How the kernel uses them (G <= 8 query heads per KV head):
//   q.k   A = query codes, row g = head g's first term, row g+8 its second
//         (residual) term; B = K^T of 8 tokens: col n = token n of the n-tile,
//         so the B fragment is 4 bytes of one key row, which ldmatrix (no
//         .trans) of the 16-byte row chunks delivers as is. The C fragment
//         of lane (g, q4) holds both terms' dot products of head g for
//         tokens 2q4, 2q4+1 of the n-tile: the score needs no shuffle.
//   P.V   A = P, row g = head g's weights as fp16 hi term, row g+8 the lo
//         term; the q.k C fragments of n-tiles 0 and 1 (tokens 2q4, 2q4+1,
//         8+2q4, 9+2q4 of head g) ARE this A fragment: no shuffle. B = V of
//         16 tokens x 8 channels: ldmatrix .trans of the byte rows delivers,
//         per lane, bytes (t, 2g), (t, 2g+1), (t+1, 2g), (t+1, 2g+1) for
//         t = 2q4 (matrix of tokens 0..7) or 8+2q4 (tokens 8..15), channels
//         relative to a 16-byte chunk: the even bytes are the B fragment of
//         an n-tile whose column n is channel 2n of the chunk, the odd bytes
//         that of the n-tile of channels 2n+1. Converted to f16 in registers
//         (exact: |code| <= 127). C of the (chunk c, parity e) n-tile, lane
//         (g, q4): c0 = head g hi, channel 16c + 4q4 + e; c1 = channel
//         16c + 4q4 + 2 + e; c2, c3 the lo term's. So each lane ends with 4
//         adjacent channels per chunk of its head g.
//   P.V, channel rows (pv_block_t; Int8sTcConfig::channel_rows): the same
//         product transposed, O^T (16 channels x 8 heads) += V^T (16 x 16
//         tokens) . P^T (16 tokens x 8 heads), so that no accumulator row
//         is spent on P's second term: A = V^T of one 16-byte chunk, row g =
//         channel 2g of the chunk, row g + 8 = channel 2g + 1 -- exactly the
//         even and odd bytes of the same ldmatrix .trans registers as above
//         (tokens 2q4, 2q4+1 in a0/a1, 8+2q4, 9+2q4 in a2/a3); B = P^T, col
//         n = head n: b0 = head g's weights of tokens 2q4, 2q4+1, b1 = of
//         8+2q4, 9+2q4, i.e. the hi (or lo) registers of the P fragment
//         above, again without a shuffle. Two mma per chunk, hi then lo terms
//         into one accumulator. C of chunk c, lane (g, q4): entry i = channel
//         16c + 2g + (i >> 1) (pvt_channel) of head 2q4 + (i & 1) (pvt_head):
//         4 accumulators per chunk instead of 8 (half the registers), and a
//         lane's heads are not its q.k head g (the rescale factor comes by
//         shuffle).
//
// Stage layout in shared memory: 16 token rows of HD bytes (K or V codes),
// the 16-byte chunks of a row XOR-swizzled (chunk_slot) so that the 8 rows
// of one ldmatrix phase hit 8 different 16-byte bank groups.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "mma_util.cuh"

namespace activekv::cuda::detail {

constexpr int kTcBlk = 16;  // tokens per block (two q.k n-tiles = the k of one P.V mma)
// P enters the f16 mma as p * 2^12 (p <= 1, so <= 4096): its lo term stays a
// normal f16 down to p ~ 2^-26 (absolute error <= 2^-37 below), and the scale
// is an exact power of two taken out once at the end.
constexpr float kPScale = 4096.f;
constexpr float kPUnscale = 1.f / 4096.f;

// Physical 16-byte slot of chunk c of row r in a stage of rows of HD bytes.
template <int HD>
__host__ __device__ constexpr int chunk_slot(int r, int c) {
  constexpr int CH = HD / 16;
  static_assert(CH == 4 || CH >= 8, "rows of 64 bytes or of 128 bytes and more");
  // CH >= 8: one row covers the 8 slots of a 128-byte line; CH = 4: two rows share a line.
  return CH >= 8 ? (c ^ (r & 7)) : (c ^ ((r >> 1) & 3));
}
template <int HD>
__host__ __device__ constexpr uint32_t stage_offset(int r, int c) {
  return uint32_t(r * HD + 16 * chunk_slot<HD>(r, c));
}

// D (16x8 s32) += A (16x32 s8) * B (32x8 s8): exact int32 sums.
__device__ __forceinline__ void mma_s8_16832(int (&d)[4], const uint4& a, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
               : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}
// D (16x8 f32) += A (16x16 f16) * B (16x8 f16).
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Where query code j (channel) of row `row` (0..15: head g's first term is
// row g, its second term row g + 8) lies in the A fragments of q.k, kept as
// [HD / 32 k-steps][32 lanes] x uint4 (a0..a3): the byte offset.
__host__ __device__ constexpr int q_frag_byte(int row, int j) {
  const int ks = j / 32, jj = j % 32;
  const int lane = 4 * (row & 7) + (jj % 16) / 4;
  const int reg = 2 * (jj / 16) + (row >> 3);  // a0: row g low cols, a1: row g+8, a2/a3: cols + 16
  return ((ks * 32 + lane) * 4 + reg) * 4 + jj % 4;
}

// Token (0..15 in the block) of q.k C-fragment entry j (0, 1) of n-tile nt for lane quad index q4.
__host__ __device__ constexpr int score_token(int nt, int q4, int j) { return 8 * nt + 2 * q4 + j; }

// Channel of P.V accumulator acc[c][e][i] (i = 0..3, C fragment entry) for lane quad index q4;
// entries 0, 1 are the hi term's, 2, 3 the lo term's of the same channels.
__host__ __device__ constexpr int pv_channel(int c, int e, int i, int q4) { return 16 * c + 4 * q4 + 2 * (i & 1) + e; }

// The q.k A fragments of a lane, held in registers for the whole split (they
// never change): sq is the shared [HD/32][32] uint4 array of q_frag_byte.
template <int HD>
__device__ __forceinline__ void load_q_frags(const uint4* sq, int lane, uint4 (&qa)[HD / 32]) {
#pragma unroll
  for (int ks = 0; ks < HD / 32; ++ks) qa[ks] = sq[ks * 32 + lane];
}

// q.k of one block: c[nt] = C fragments of tokens 8nt..8nt+7 (rows: see
// q_frag_byte). qa: the lane's A fragments (load_q_frags); stage_k: the
// shared address of the block's key codes (stage layout).
// The k-steps alternate between two accumulator sets that are added at the
// end: four independent mma chains of HD/64 instead of two of HD/32 (the
// warp waits on this chain before its softmax). int32 sums are exact, so
// the order changes no bit.
template <int HD>
__device__ __forceinline__ void qk_block(const uint4 (&qa)[HD / 32], uint32_t stage_k, int lane, int (&c)[2][4]) {
  static_assert(HD % 64 == 0, "an even number of 32-channel k-steps");
  // ldmatrix x4 addressing: matrix i = (tokens 8(i>>1)..+7, chunk 2ks + (i&1)),
  // so registers 0, 1 are b0, b1 of n-tile 0 and 2, 3 those of n-tile 1.
  const int i = lane >> 3, r = 8 * (i >> 1) + (lane & 7), ch = i & 1;
  int d[2][2][4];  // [k-step parity][n-tile][entry]
#pragma unroll
  for (int s = 0; s < 2; ++s)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) d[s][nt][e] = 0;
#pragma unroll
  for (int ks = 0; ks < HD / 32; ++ks) {
    uint32_t b[4];
    ldsm_x4(b, stage_k + stage_offset<HD>(r, 2 * ks + ch));
    mma_s8_16832(d[ks & 1][0], qa[ks], b[0], b[1]);
    mma_s8_16832(d[ks & 1][1], qa[ks], b[2], b[3]);
  }
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) c[nt][e] = d[0][nt][e] + d[1][nt][e];
}

// 4 int8 codes (bytes b0..b3 of w) -> f16 pairs (b0, b2) and (b1, b3), exact:
// the byte + 128 goes into the mantissa of 1024 (f16 0x6400 | u = 1024 + u),
// then 1152 = 1024 + 128 comes off.
__device__ __forceinline__ void s8x4_to_f16x2(uint32_t w, uint32_t& even, uint32_t& odd) {
  const uint32_t u = w ^ 0x80808080u;
  const uint32_t e = __byte_perm(u, 0x64646464u, 0x4240);  // bytes: b0, 0x64, b2, 0x64
  const uint32_t o = __byte_perm(u, 0x64646464u, 0x4341);  // bytes: b1, 0x64, b3, 0x64
  const __half2 bias = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480));  // 1152
  const __half2 he = __hsub2(*reinterpret_cast<const __half2*>(&e), bias);
  const __half2 ho = __hsub2(*reinterpret_cast<const __half2*>(&o), bias);
  even = *reinterpret_cast<const uint32_t*>(&he);
  odd = *reinterpret_cast<const uint32_t*>(&ho);
}

// f16 pair as b32 (x0 the low half).
__device__ __forceinline__ uint32_t pack_f16(__half x0, __half x1) {
  const __half2 v = __halves2half2(x0, x1);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The P.V A fragment of head g from its 4 weights p[nt][j] (token
// score_token(nt, q4, j)), each <= 1: p * kPScale as f16 hi + lo (rows g, g + 8).
__device__ __forceinline__ void p_frag(const float (&p)[2][2], uint32_t (&a)[4]) {
  __half hi[2][2], lo[2][2];
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float x = p[nt][j] * kPScale;  // exact (power of two)
      hi[nt][j] = __float2half_rn(x);
      lo[nt][j] = __float2half_rn(x - __half2float(hi[nt][j]));  // the difference is exact in fp32
    }
  a[0] = pack_f16(hi[0][0], hi[0][1]);
  a[1] = pack_f16(lo[0][0], lo[0][1]);
  a[2] = pack_f16(hi[1][0], hi[1][1]);
  a[3] = pack_f16(lo[1][0], lo[1][1]);
}

// The value codes of one block, 16 channels (one 16-byte chunk) at a time,
// as f16 pairs: ldmatrix x4 .trans addressing, matrix i = (tokens
// 8(i&1)..+7, chunk 2cp + (i>>1)), so registers 0, 1 hold tokens 0..7,
// 8..15 of chunk 2cp and 2, 3 those of chunk 2cp + 1. For chunk c,
// f(c, e0, o0, e1, o1): e = the even channels' bytes, o = the odd ones',
// of tokens 2q4, 2q4+1 (e0, o0) and 8+2q4, 9+2q4 (e1, o1).
template <int HD, class F>
__device__ __forceinline__ void for_each_v_chunk(uint32_t stage_v, int lane, F&& f) {
  const int i = lane >> 3, r = 8 * (i & 1) + (lane & 7), ch = i >> 1;
#pragma unroll
  for (int cp = 0; cp < HD / 32; ++cp) {
    uint32_t w[4];
    ldsm_x4_t(w, stage_v + stage_offset<HD>(r, 2 * cp + ch));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t e0, o0, e1, o1;
      s8x4_to_f16x2(w[2 * h], e0, o0);
      s8x4_to_f16x2(w[2 * h + 1], e1, o1);
      f(2 * cp + h, e0, o0, e1, o1);
    }
  }
}

// P.V of one block: acc[c][e] += the C fragment of channels 16c + 2n + e
// (pv_channel). stage_v: the shared address of the block's value codes.
template <int HD>
__device__ __forceinline__ void pv_block(uint32_t stage_v, const uint32_t (&a)[4], int lane,
                                         float (&acc)[HD / 16][2][4]) {
  for_each_v_chunk<HD>(stage_v, lane, [&](int c, uint32_t e0, uint32_t o0, uint32_t e1, uint32_t o1) {
    mma_f16_16816(acc[c][0], a, e0, e1);  // B = the even channels of the chunk
    mma_f16_16816(acc[c][1], a, o0, o1);  // and the odd ones
  });
}

// Channel rows: channel and head of pv_block_t's accumulator acc[c][i] for lane (g, q4).
__host__ __device__ constexpr int pvt_channel(int c, int i, int g) { return 16 * c + 2 * g + (i >> 1); }
__host__ __device__ constexpr int pvt_head(int i, int q4) { return 2 * q4 + (i & 1); }

// P.V of one block with the channels in the mma rows: acc[c][0] (chunk c, entries
// as pvt_channel / pvt_head) += V^T . P^T with P's hi terms, then its lo
// terms. a: the P fragment of p_frag (a[0], a[2] the hi terms of tokens
// 2q4.., 8+2q4..; a[1], a[3] the lo terms), which is the B fragment here.
template <int HD>
__device__ __forceinline__ void pv_block_t(uint32_t stage_v, const uint32_t (&a)[4], int lane,
                                           float (&acc)[HD / 16][1][4]) {
  for_each_v_chunk<HD>(stage_v, lane, [&](int c, uint32_t e0, uint32_t o0, uint32_t e1, uint32_t o1) {
    const uint32_t v[4] = {e0, o0, e1, o1};  // the A fragment V^T: rows g / g + 8 = channels 2g / 2g + 1
    mma_f16_16816(acc[c][0], v, a[0], a[2]);  // P's hi terms
    mma_f16_16816(acc[c][0], v, a[1], a[3]);  // then its lo terms
  });
}

}  // namespace activekv::cuda::detail
