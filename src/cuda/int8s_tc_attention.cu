// int8s split attention, tensor-core kernel (Int8sKernel::tc; issue 13).
// Contract: launch_split_attention_int8s in include/activekv/cuda/format_kernels.h
// (same work list, partials, merge and arithmetic contract as the legacy
// kernel of int8s_attention.cu). Fragment layouts: int8s_tc_fragments.cuh.
//
// Designed like the bf16 split kernel (decode_attention.cu): CTA = one split
// x one KV head, W warps; warp w takes the split's stages of B 16-token
// blocks w, w + W, ... through its own NS-stage cp.async ring (K and V codes
// of B blocks per stage; single_v: K codes of 2 stages, V codes of one), so
// the main loop has no CTA barrier, only __syncwarp. W, NS, B and single_v
// are compile-time (Int8sTcConfig, chosen at run time among the instantiated
// configurations of kConfigs). Per block and warp:
//   S = Q . K^T     mma.m16n8k32.s8: rows g / g + 8 = head g's two int8
//                   query terms, exact int32 dot products; the token scale
//                   and row scale multiply the accumulator fragment:
//                   s_t = ((hi + lo / 127) * s_t) * a_g * scale * log2 e
//                   (the legacy kernel's expression, int8s_score.cuh, so
//                   the same bits);
//   online softmax in registers, base 2 (4 lanes per head, butterflies);
//   O += P . V      mma.m16n8k16.f16: P as f16 hi + lo terms (rows g / g + 8)
//                   of p * 2^12, V codes converted to f16 in registers (exact);
//                   fp32 accumulation on raw codes.
// The W warp states merge in shared memory in fixed order after the loop
// (per-head weights, split_tail.cuh), then O = (acc * 2^-12 * v_j) / l: the
// page's value scale once (a split
// never crosses a page). No atomics: bitwise repeatable.
// The group size is a template parameter (prologue and epilogue loops);
// the main loop always computes 8 heads x 2 terms, the rows of the mma.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

#include "activekv/kv/int8s_layout.h"
#include "int8s_query.cuh"
#include "int8s_score.cuh"
#include "int8s_tc.h"
#include "int8s_tc_fragments.cuh"
#include "mma_util.cuh"
#include "once_per_device.h"
#include "pdl.cuh"
#include "split_tail.cuh"

namespace activekv::cuda {
namespace {

using namespace detail;  // mma_util.cuh, int8s_tc_fragments.cuh, int8s_query.cuh, int8s_score.cuh

constexpr int kRows = 8;  // query heads per KV head the mma rows hold

// The instantiated launch configurations (Int8sTcConfig): warps per CTA, ring
// stages per warp, 16-token blocks per stage, P.V in channel rows. The first
// two are the defaults for head_dim 256 and 64; the rest are the sweep's
// (bench/gpu/int8s_sweep.sh). Adding one here instantiates it for both
// head_dims and every group; tests/cuda/test_formats.cpp runs them all.
// w4s2cv for head_dim 256: it and w3s2c fit 4 CTAs per SM (54 KiB each of
// shared memory; w4s2c's 71 KiB fit 3), for the 128K grid's 1024 CTAs 1.94
// waves instead of 2.59. The H200 sweep at 4234a46 (27B shape, resident,
// split 512; bench/results/h200_int8s_sweep_4234a46.json): int8s 0.566 /
// 1.631 ms at 32K / 128K against w4s2c's 0.576 / 1.742 and w3s2c's 0.609 /
// 1.706; hybrid 0.602 / 1.685 against 0.625 / 1.783. w4s2c had been the
// sweep's choice at b0220f2 (int8s 0.634 / 1.938 ms against w2s3's 0.881 /
// 1.959). w4s4 for head_dim 64 is unmeasured by the sweep (the old default).
struct Cfg { int w, s, b; bool c, v; };
constexpr Cfg kConfigs[] = {{4, 2, 1, true, true},   {4, 4, 1, false, false}, {2, 3, 1, false, false},
                            {2, 2, 1, false, false}, {2, 4, 1, false, false}, {4, 2, 1, false, false},
                            {4, 3, 1, false, false}, {2, 2, 2, false, false}, {4, 2, 2, false, false},
                            {2, 2, 1, true, false},  {2, 3, 1, true, false},  {4, 3, 1, true, false},
                            {4, 4, 1, true, false},  {3, 2, 1, true, false},  {4, 2, 1, true, false}};
constexpr int kNumConfigs = int(sizeof(kConfigs) / sizeof(kConfigs[0]));
constexpr Cfg default_cfg(int head_dim) { return head_dim >= 256 ? kConfigs[0] : kConfigs[1]; }

template <int HD, int B> __host__ __device__ constexpr int tc_stage_bytes() { return 2 * B * kTcBlk * HD; }  // K then V codes

// Bytes of one warp's ring: NS stages of K and V codes, or (V1: single_v)
// NS stages of K codes and one of V codes.
template <int HD, int NS, int B, bool V1>
__host__ __device__ constexpr int tc_warp_ring_bytes() {
  return V1 ? (NS + 1) * B * kTcBlk * HD : NS * tc_stage_bytes<HD, B>();
}

// Shared memory: [ring | merge area aliasing it] [query fragments] [row scales] [token scales of the split].
template <int HD, int W, int NS, int B, bool V1>
__host__ __device__ constexpr size_t tc_ring_bytes() {
  const size_t ring = size_t(W) * tc_warp_ring_bytes<HD, NS, B, V1>();
  const size_t merge = size_t(W) * kRows * (HD + 2) * 4 + kRows * sizeof(split_tail::HeadMerge<W>);
  return ring > merge ? ring : merge;
}
template <int HD, int W, int NS, int B, bool V1>
constexpr size_t tc_fixed_smem() { return tc_ring_bytes<HD, W, NS, B, V1>() + size_t(HD) * 16 + kRows * 4; }
template <int HD, int W, int NS, int B, bool V1> constexpr size_t tc_smem(int split_tokens) {
  constexpr int T = B * kTcBlk;  // tokens per stage: the token scales are read up to a whole stage
  return tc_fixed_smem<HD, W, NS, B, V1>() + size_t((split_tokens + T - 1) / T * T) * 4;
}
constexpr size_t kMaxSmem = 227 * 1024;  // sm_90 opt-in limit per CTA

// Prologue of one KV head: each warp takes query heads warp, warp + W, ... of
// the 8 mma rows: q'_j = q_j c_j, a = max|q'| / 127, codes of q' (and of the
// residual when two terms) written into the q.k A fragments; rows of heads
// >= G get zero codes and a zero row scale (their scores are 0, discarded).
// All of the warp's loads (its rows of q, the channel scales) are issued
// before any arithmetic, so the prologue waits for global memory once, not
// once per row (the arithmetic per value is unchanged: same bits).
template <int HD, int G, int W>
__device__ __forceinline__ void quantise_queries(const float* qrow0, const __half* c_scale, int terms,
                                                 float scale_log2, unsigned char* sq, float* row_scale, int warp,
                                                 int lane) {
  constexpr int R = (kRows + W - 1) / W, NJ = HD / 32;  // rows per warp, values per lane and row
  float c[NJ];
#pragma unroll
  for (int i = 0; i < NJ; ++i) c[i] = __half2float(c_scale[lane + 32 * i]);
  float x[R][NJ];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int g = warp + r * W;
#pragma unroll
    for (int i = 0; i < NJ; ++i) x[r][i] = g < G ? qrow0[size_t(g) * HD + lane + 32 * i] * c[i] : 0.f;
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int g = warp + r * W;
    if (g >= kRows) break;
    if (g >= G) {  // an unused mma row (warp-uniform): zero codes and scale, no divisions
#pragma unroll
      for (int i = 0; i < NJ; ++i) sq[q_frag_byte(g, lane + 32 * i)] = sq[q_frag_byte(g + 8, lane + 32 * i)] = 0;
      if (lane == 0) row_scale[g] = 0.f;
      continue;
    }
    float mx = 0.f;
#pragma unroll
    for (int i = 0; i < NJ; ++i) mx = fmaxf(mx, fabsf(x[r][i]));
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const float a = mx / 127.f;
#pragma unroll
    for (int i = 0; i < NJ; ++i) {
      const int j = lane + 32 * i;
      const int8_t hi = quantise_int8(x[r][i], a);
      sq[q_frag_byte(g, j)] = uint8_t(hi);
      sq[q_frag_byte(g + 8, j)] = uint8_t(terms == 2 ? quantise_int8_residual(x[r][i], a, hi) : int8_t(0));
    }
    if (lane == 0) row_scale[g] = a * scale_log2;
  }
}

// One lane's share of the copies that fill a stage (T token rows of one
// plane, K or V codes): copy i moves chunk c = lane % CH of row
// r_i = lane / CH + i * RPI. The swizzled shared offsets of the NI copies are
// per-lane constants, computed once; the global ones are lane_src + i * RPI
// * HD. So a full stage costs one add and one cp.async per copy, the rest in
// the instructions' immediates (the SASS of the loop recomputed ~180 integer
// operations per stage before). The split's last stage, when it runs past
// the end, zero-fills the missing rows.
template <int HD, int T>
struct StageCopier {
  static constexpr int CH = HD / 16, RPI = 32 / CH, NI = T * CH / 32;
  static_assert(32 % CH == 0 && (T * CH) % 32 == 0, "whole rows per copy index");
  uint32_t doff[NI];  // shared offset of copy i in a stage's rows
  int lane_src;       // global offset of copy 0 from the stage's first row

  __device__ __forceinline__ explicit StageCopier(int lane) : lane_src((lane / CH) * HD + (lane % CH) * 16) {
#pragma unroll
    for (int i = 0; i < NI; ++i) doff[i] = stage_offset<HD>(lane / CH + i * RPI, lane % CH);
  }
  // Rows t0.. of the split's codes of one plane (plane: its row 0) into the
  // stage at shared address base + DST (DST: an immediate).
  template <int DST>
  __device__ __forceinline__ void issue(uint32_t base, const unsigned char* plane, int t0, int ntok, int lane) const {
    if (t0 + T <= ntok) {
      full<DST>(base, plane + size_t(t0) * HD + lane_src, std::make_index_sequence<NI>{});
      return;
    }
#pragma unroll
    for (int i = 0; i < NI; ++i) {
      const int r = lane / CH + i * RPI;
      const bool ok = t0 + r < ntok;  // rows past the split are zero-filled
      cp_async16(base + DST + doff[i], plane + size_t(ok ? t0 + r : t0) * HD + size_t(lane % CH) * 16, ok ? 16 : 0);
    }
  }

 private:
  template <int DST, size_t... I>
  __device__ __forceinline__ void full(uint32_t base, const unsigned char* g, std::index_sequence<I...>) const {
    (cp_async16_at<DST, int(I) * RPI * HD>(base + doff[I], g), ...);
  }
};

// One 16-token block of a warp (tokens t0.. of the split, key codes at
// shared address sk, value codes at sv): S = Q.K^T on int8 tensor cores,
// scores of tokens >= ntok masked, online softmax in base 2 (m_run, l_run:
// head g's running reference and this lane's share of the denominator),
// O += P.V on f16 tensor cores.
// CR: P.V in channel rows (pv_block_t; acc[c][0]), else pv_block (acc[c][parity]).
// QREG: the query fragments qa are in registers, else read from shared
// memory (sq) per block (the single_v configurations' register budget).
// before_pv() runs between the softmax and P.V (single_v: wait for the V codes).
template <int HD, bool CR, bool QREG, class BeforePv>
__device__ __forceinline__ void attend_block(const uint4 (&qa)[HD / 32], const uint4* sq, uint32_t sk, uint32_t sv,
                                             const float* s_tok, int t0, int ntok, float rs,
                                             const Int8sKernelOptions& opt, int lane, float& m_run, float& l_run,
                                             float (&acc)[HD / 16][CR ? 1 : 2][4], BeforePv&& before_pv) {
  constexpr int CH = HD / 16, E = CR ? 1 : 2;
  const int q4 = lane & 3;
  int dots[2][4];
  if constexpr (QREG) {
    qk_block<HD>(qa, sk, lane, dots);
  } else {
    uint4 q[HD / 32];
    load_q_frags<HD>(sq, lane, q);
    qk_block<HD>(q, sk, lane, dots);
  }
  float s[2][2];
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int t = t0 + score_token(nt, q4, j);
      s[nt][j] = t < ntok ? int8s_score(dots[nt][j], dots[nt][2 + j], s_tok[t], rs) : -INFINITY;
    }
  // --- online softmax, base 2 ---------------------------------------------
  float p[2][2];
  const float alpha = online_softmax_block(s, m_run, l_run, p, opt.pow2_reference);
  // pv_block: both accumulator rows of this lane are head g's, its own alpha.
  // pv_block_t: entries i hold head 2q4 + (i & 1), whose alpha lanes 8q4 and
  // 8q4 + 4 hold (every lane of a head's quad has it).
  // SPEC §4 trick 1: skipped when every factor of the warp is 1 (x 1.0 changes no bit).
  if (!(opt.skip_unit_rescale && __all_sync(0xffffffffu, alpha == 1.f))) {
    float al[2] = {alpha, alpha};
    if constexpr (CR) {
      al[0] = __shfl_sync(0xffffffffu, alpha, 8 * q4);
      al[1] = __shfl_sync(0xffffffffu, alpha, 8 * q4 + 4);
    }
#pragma unroll
    for (int c = 0; c < CH; ++c)
#pragma unroll
      for (int e = 0; e < E; ++e)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[c][e][i] *= al[i & 1];
  }
  uint32_t pa[4];
  p_frag(p, pa);
  before_pv();
  if constexpr (CR) pv_block_t<HD>(sv, pa, lane, acc);
  else pv_block<HD>(sv, pa, lane, acc);
}

// Resident CTAs per SM that the shared memory allows at the default split of
// 512 tokens (228 KiB per SM, 1 KiB of it reserved per CTA), at most 512 / W
// warps' worth of 128 registers: the register budget each configuration is
// compiled for (__launch_bounds__). Without it the compiler's choice moved
// w4s2c from 168 registers (3 CTAs per SM) to 228 (2) on an unrelated change.
template <int HD, int W, int NS, int B, bool V1>
constexpr int tc_ctas_per_sm() {
  const int by_smem = int((228 * 1024) / (tc_smem<HD, W, NS, B, V1>(512) + 1024));
  const int by_regs = 65536 / (W * 32 * 128);
  const int n = by_smem < by_regs ? by_smem : by_regs;
  return n < 1 ? 1 : n;
}

template <int HD, int G, int W, int NS, int B, bool CR, bool V1>
__global__ void __launch_bounds__(W * 32, (tc_ctas_per_sm<HD, W, NS, B, V1>()))
int8s_tc_kernel(const SplitWork* __restrict__ work, const float* __restrict__ q, float* __restrict__ part_o,
                float* __restrict__ part_lse, int max_splits, int n_kv, int page_size, float scale_log2,
                Int8sKernelOptions opt, int head0) {
  constexpr int SB = tc_stage_bytes<HD, B>(), T = B * kTcBlk;  // bytes, tokens per stage
  constexpr int CH = HD / 16;  // 16-byte chunks per row
  static_assert(G >= 1 && G <= kRows, "the mma rows hold 8 heads x 2 query terms");
  static_assert(NS >= 2 && W >= 2 && W <= 4 && B >= 1, "ring of >= 2 stages; 2 to 4 warps share the 8 query rows");
  static_assert(!V1 || (NS == 2 && B == 1), "single_v: two K stages, one block per stage");
  constexpr bool QREG = !V1;  // query fragments in registers (32 at head_dim 256) unless single_v
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* sq_bytes = smem + tc_ring_bytes<HD, W, NS, B, V1>();
  const uint4* sq = reinterpret_cast<const uint4*>(sq_bytes);
  float* row_scale = reinterpret_cast<float*>(sq_bytes + HD * 16);
  float* s_tok = row_scale + kRows;

  pdl::begin();  // before any global read: pages, queries and the work list may be the previous kernels' writes
  const SplitWork w = work[blockIdx.x];
  const int h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q4 = lane & 3;
  const kv::Int8sSectionLayout lay{size_t(HD), size_t(page_size)};  // full pages only (the engine checks)
  const unsigned char* base = static_cast<const unsigned char*>(w.page) + lay.head_offset(head0 + h);  // shard: its heads
  const unsigned char* kq = base + lay.key_codes() + size_t(w.tok0) * HD;
  const unsigned char* vq = base + lay.value_codes() + size_t(w.tok0) * HD;

  // --- the warp's ring: stage it % NS holds tokens [T (warp + it W), + T) ---
  // A stage is [K rows 0..T-1][V rows 0..T-1]; block b's K codes start at row
  // 16 b, whose swizzle (chunk_slot) is that of a block of its own. single_v:
  // [K stage 0][K stage 1][V], one commit group per plane and stage.
  const uint32_t ring = smem_u32(smem) + uint32_t(warp * tc_warp_ring_bytes<HD, NS, B, V1>());
  const int nst = (w.ntok + T - 1) / T;
  const int n_it = warp < nst ? (nst - warp + W - 1) / W : 0;
  const StageCopier<HD, T> copier(lane);
  auto tok0 = [&](int it) { return (warp + it * W) * T; };
  auto k_stage = [&](int it) { return ring + uint32_t((it % NS) * (V1 ? T * HD : SB)); };
  constexpr int kVSlot = V1 ? NS * T * HD : T * HD;  // V codes: from the ring (V1) or from the K stage
  auto issue_k = [&](int it) { copier.template issue<0>(k_stage(it), kq, tok0(it), w.ntok, lane); };
  auto issue_v = [&](int it) { copier.template issue<kVSlot>(V1 ? ring : k_stage(it), vq, tok0(it), w.ntok, lane); };
  if constexpr (V1) {  // groups: K0, V0
    if (n_it > 0) issue_k(0);
    cp_async_commit();
    if (n_it > 0) issue_v(0);
    cp_async_commit();
  } else {
#pragma unroll
    for (int i = 0; i < NS - 1; ++i) {
      if (i < n_it) { issue_k(i); issue_v(i); }
      cp_async_commit();
    }
  }

  // --- prologue (overlaps the first copies): query codes, token scales ------
  const __half* c_scale = reinterpret_cast<const __half*>(base + lay.key_channel_scales());
  const __half* t_scale = reinterpret_cast<const __half*>(base + lay.key_token_scales()) + w.tok0;
  const int nq = n_kv * G;
  // The split's first kTokPre x W x 32 token scales are loaded before the
  // query is quantised, so that both wait for memory once (ncu at 756312e:
  // loaded after it, that second wait took ~4.5 % of the stall samples).
  constexpr int kTokPre = 4;
  __half t_pre[kTokPre];
#pragma unroll
  for (int i = 0; i < kTokPre; ++i) {
    const int t = threadIdx.x + i * W * 32;
    t_pre[i] = t < w.ntok ? t_scale[t] : __float2half(0.f);
  }
  quantise_queries<HD, G, W>(q + (size_t(w.seq) * nq + size_t(h) * G) * HD, c_scale, opt.query_terms, scale_log2,
                             sq_bytes, row_scale, warp, lane);
#pragma unroll
  for (int i = 0; i < kTokPre; ++i) {
    const int t = threadIdx.x + i * W * 32;
    if (t < nst * T) s_tok[t] = __half2float(t_pre[i]);  // 0 past the split's end, as below
  }
  for (int t = threadIdx.x + kTokPre * W * 32; t < nst * T; t += W * 32)
    s_tok[t] = t < w.ntok ? __half2float(t_scale[t]) : 0.f;
  __syncthreads();
  const float rs = row_scale[g];
  uint4 qa[HD / 32];  // the query's q.k A fragments, in registers for the whole split (QREG)
  if constexpr (QREG) load_q_frags<HD>(sq, lane, qa);

  float m_run = -INFINITY, l_run = 0.f;  // head g; l_run: this lane's tokens only
  constexpr int E = CR ? 1 : 2;
  float acc[CH][E][4];  // P.V C fragments: [chunk][parity][entry] (pv_channel), CR: [chunk][0][entry] (pvt_*)
#pragma unroll
  for (int c = 0; c < CH; ++c)
#pragma unroll
    for (int e = 0; e < E; ++e)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[c][e][i] = 0.f;

  for (int it = 0; it < n_it; ++it) {
    if constexpr (V1) {
      // Outstanding after K(it): V(it) (committed at the end of the last
      // iteration) and K(it + 1) (now).
      if (it + 1 < n_it) issue_k(it + 1);
      cp_async_commit();
      cp_async_wait<2>();
      __syncwarp();
      const int t0 = tok0(it);
      attend_block<HD, CR, QREG>(qa, sq, k_stage(it), ring + kVSlot, s_tok, t0, w.ntok, rs, opt, lane, m_run, l_run,
                                 acc, [] {
                                   cp_async_wait<1>();  // V(it); K(it + 1) may still be in flight
                                   __syncwarp();
                                 });
      __syncwarp();  // all lanes done with K stage it and the V slot
      if (it + 1 < n_it) issue_v(it + 1);
      cp_async_commit();
      continue;
    }
    if (it + NS - 1 < n_it) { issue_k(it + NS - 1); issue_v(it + NS - 1); }
    cp_async_commit();
    cp_async_wait<NS - 1>();
    __syncwarp();  // every lane's copies of this stage are visible to the whole warp
    const uint32_t sk = k_stage(it), sv = sk + T * HD;
#pragma unroll
    for (int b = 0; b < B; ++b) {
      const int t0 = tok0(it) + b * kTcBlk;
      if (B > 1 && t0 >= w.ntok) break;  // the split's end (warp-uniform)
      attend_block<HD, CR, QREG>(qa, sq, sk + uint32_t(b * kTcBlk * HD), sv + uint32_t(b * kTcBlk * HD), s_tok, t0,
                                 w.ntok, rs, opt, lane, m_run, l_run, acc, [] {});
    }
    __syncwarp();  // all lanes done reading this stage before it is refilled
  }
  cp_async_wait<0>();
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);  // row sum over the 4 lanes of head g
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);
  __syncthreads();  // the merge area aliases every warp's ring

  // --- merge the W warp states in fixed order, then the partial -------------
  float* sm_acc = reinterpret_cast<float*>(smem);  // [W][kRows][HD]
  float* sm_m = sm_acc + size_t(W) * kRows * HD;   // [W][kRows]
  float* sm_l = sm_m + W * kRows;                  // [W][kRows]
  using HeadMerge = split_tail::HeadMerge<W>;
  HeadMerge* sm_hm = reinterpret_cast<HeadMerge*>(sm_l + W * kRows);  // [kRows]
  if (g < G && q4 == 0) { sm_m[warp * kRows + g] = m_run; sm_l[warp * kRows + g] = l_run; }
  if constexpr (CR) {  // lane: channels 16c + 2g, + 1 of heads 2q4, 2q4 + 1 (all 8 rows; rows >= G unread)
    float* dst = sm_acc + (size_t(warp) * kRows + 2 * q4) * HD + 2 * g;
    static_assert(pvt_channel(0, 2, 0) == 1 && pvt_head(1, 0) == 1 && pvt_head(2, 0) == 0,
                  "the float2s below list channels 2g, 2g + 1 of heads 2q4, 2q4 + 1");
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      *reinterpret_cast<float2*>(dst + 16 * c) = make_float2(acc[c][0][0], acc[c][0][2]);
      *reinterpret_cast<float2*>(dst + HD + 16 * c) = make_float2(acc[c][0][1], acc[c][0][3]);
    }
  } else if (g < G) {
    float* dst = sm_acc + (size_t(warp) * kRows + g) * HD;
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      // hi + lo term of the lane's 4 adjacent channels 16c + 4q4 + {0, 1, 2, 3}
      const float4 v = make_float4(acc[c][0][0] + acc[c][0][2], acc[c][1][0] + acc[c][1][2],
                                   acc[c][0][1] + acc[c][0][3], acc[c][1][1] + acc[c][1][3]);
      static_assert(pv_channel(0, 1, 0, 0) == 1 && pv_channel(0, 0, 1, 0) == 2 && pv_channel(0, 1, 3, 1) == 7,
                    "the float4 above lists channels 16c + 4q4 + 0..3 in order");
      *reinterpret_cast<float4*>(dst + pv_channel(c, 0, 0, q4)) = v;
    }
  }
  // The value scales of this thread's outputs, loaded while the merge area
  // fills: one wait for global memory, not one per output.
  constexpr int NT = W * 32, PER = (G * HD + NT - 1) / NT;  // outputs per thread
  const __half* v_scale = reinterpret_cast<const __half*>(base + lay.value_channel_scales());
  float vs[PER];
#pragma unroll
  for (int k = 0; k < PER; ++k) {
    const int idx = threadIdx.x + k * NT;
    vs[k] = idx < G * HD ? __half2float(v_scale[idx % HD]) : 0.f;
  }
  __syncthreads();

  // Each head's merge weights once (split_tail.cuh: the per-output form's
  // arithmetic in the same order, so the same bits); every output then takes
  // only its W products.
  const size_t out_base = (size_t(w.seq) * max_splits + w.split) * nq + size_t(h) * G;
  if (threadIdx.x < G) {
    const HeadMerge hm = split_tail::head_merge<W>(sm_m + threadIdx.x, sm_l + threadIdx.x, kRows);
    sm_hm[threadIdx.x] = hm;
    const bool empty = hm.valid == 0 || !(hm.L > 0.f);
    part_lse[out_base + threadIdx.x] = empty ? -INFINITY : split_tail::merged_lse(hm, kLn2);
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < PER; ++k) {
    const int idx = threadIdx.x + k * NT;
    if (idx >= G * HD) break;
    const int gg = idx / HD, c = idx % HD;
    const HeadMerge& hm = sm_hm[gg];
    float O = 0.f;
#pragma unroll
    for (int i = 0; i < W; ++i)
      if (hm.valid >> i & 1u) O = fmaf(hm.sc[i], sm_acc[(size_t(i) * kRows + gg) * HD + c], O);
    const bool empty = hm.valid == 0 || !(hm.L > 0.f);
    part_o[(out_base + gg) * HD + c] = empty ? 0.f : ((O * kPUnscale) * vs[k]) / hm.L;
  }
}

template <int HD, int G, int W, int NS, int B, bool CR, bool V1>
void launch_tc(const AttnShape& sh, const SplitWork* work, int n_work, const float* q, Partials p, float sl2,
               const Int8sKernelOptions& opt, cudaStream_t st) {
  static_assert(tc_smem<HD, W, NS, B, V1>(kMaxTcSplit) <= kMaxSmem, "configuration over the shared memory per CTA");
  // Over the 48 KiB default: the limit is raised (to the largest split) per device and instantiation.
  static OncePerDevice smem_limit_set;
  smem_limit_set([] {
    check_cuda(cudaFuncSetAttribute(int8s_tc_kernel<HD, G, W, NS, B, CR, V1>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(tc_smem<HD, W, NS, B, V1>(kMaxTcSplit))),
               "cudaFuncSetAttribute(int8s_tc_kernel)");
  });
  // Programmatic dependent launch (pdl.cuh), as the bf16 split kernel: the
  // CTAs are scheduled while the kernel before drains, and wait in pdl::begin().
  pdl::launch("int8s_tc_kernel launch", int8s_tc_kernel<HD, G, W, NS, B, CR, V1>, dim3(n_work, sh.n_kv_heads), W * 32,
              tc_smem<HD, W, NS, B, V1>(sh.split_tokens), st, work, q, p.o, p.lse, p.max_splits, sh.n_kv_heads,
              sh.page_size, sl2, opt, sh.kv_head0);
}

// The instantiation of configuration `c` (one of kConfigs; the caller checked).
template <int HD, int G, size_t... I>
void launch_tc_config(const Cfg& c, std::index_sequence<I...>, const AttnShape& sh, const SplitWork* work, int n_work,
                      const float* q, Partials p, float sl2, const Int8sKernelOptions& opt, cudaStream_t st) {
  const bool hit = ((c.w == kConfigs[I].w && c.s == kConfigs[I].s && c.b == kConfigs[I].b && c.c == kConfigs[I].c &&
                             c.v == kConfigs[I].v
                         ? (launch_tc<HD, G, kConfigs[I].w, kConfigs[I].s, kConfigs[I].b, kConfigs[I].c, kConfigs[I].v>(
                                sh, work, n_work, q, p, sl2, opt, st),
                            true)
                         : false) ||
                    ...);
  if (!hit) throw InvalidArgument("int8s tc kernel: configuration not instantiated");  // unreachable: resolved before
}

template <int HD>
void launch_tc_group(const Cfg& c, const AttnShape& sh, const SplitWork* work, int n_work, const float* q, Partials p,
                     float sl2, const Int8sKernelOptions& opt, cudaStream_t st) {
  constexpr auto all = std::make_index_sequence<kNumConfigs>{};
  switch (sh.group) {
    case 3: return launch_tc_config<HD, 3>(c, all, sh, work, n_work, q, p, sl2, opt, st);
    case 4: return launch_tc_config<HD, 4>(c, all, sh, work, n_work, q, p, sl2, opt, st);
    case 6: return launch_tc_config<HD, 6>(c, all, sh, work, n_work, q, p, sl2, opt, st);
    case 7: return launch_tc_config<HD, 7>(c, all, sh, work, n_work, q, p, sl2, opt, st);
    case 8: return launch_tc_config<HD, 8>(c, all, sh, work, n_work, q, p, sl2, opt, st);
    default: break;
  }
  throw InvalidArgument(tc_group_error(sh.group));
}

std::string cfg_name(const Cfg& c) {
  return "w" + std::to_string(c.w) + "s" + std::to_string(c.s) + (c.b == 1 ? "" : "b" + std::to_string(c.b)) +
         (c.c ? "c" : "") + (c.v ? "v" : "");
}

const Int8sTcConfig* env_config() {
  // Read once per process (the bench sets it per run: bench/gpu/int8s_sweep.sh).
  static const std::optional<Int8sTcConfig> env = []() -> std::optional<Int8sTcConfig> {
    const char* e = std::getenv("ACTIVEKV_INT8S_TC_CONFIG");
    if (!e || !*e) return std::nullopt;
    try {
      return parse_int8s_tc_config(e);
    } catch (const InvalidArgument& err) {
      throw InvalidArgument(std::string("ACTIVEKV_INT8S_TC_CONFIG: ") + err.what());
    }
  }();
  return env ? &*env : nullptr;
}

}  // namespace

const std::vector<std::string>& int8s_tc_config_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const Cfg& c : kConfigs) n.push_back(cfg_name(c));
    return n;
  }();
  return names;
}

Int8sTcConfig parse_int8s_tc_config(const std::string& name) {
  if (name.empty() || name == "default") return {};
  for (const Cfg& c : kConfigs)
    if (cfg_name(c) == name) return {c.w, c.s, c.b, c.c, c.v};
  std::string list;
  for (const std::string& n : int8s_tc_config_names()) list += (list.empty() ? "" : ", ") + n;
  throw InvalidArgument("int8s tc kernel: configuration '" + name + "' is not instantiated (" + list + ", or default)");
}

std::string int8s_tc_config_name(const Int8sTcConfig& c) {
  return c.is_default() ? "default" : cfg_name({c.warps, c.stages, c.blocks, c.channel_rows, c.single_v});
}

Int8sTcConfig resolve_int8s_tc_config(const Int8sTcConfig& c, int head_dim) {
  if (!c.is_default()) {
    parse_int8s_tc_config(int8s_tc_config_name(c));  // throws for one not instantiated
    return c;
  }
  if (const Int8sTcConfig* e = env_config(); e && !e->is_default()) return *e;
  const Cfg d = default_cfg(head_dim);
  return {d.w, d.s, d.b, d.c, d.v};
}

bool int8s_tc_supports_group(int group) {
  return group == 3 || group == 4 || group == 6 || group == 7 || group == 8;
}

std::string tc_group_error(int group) {
  return "int8s tc kernel: " + std::to_string(group) +
         " query heads per KV head is not instantiated (3, 4, 6, 7 or 8; the legacy kernel takes 1..8)";
}

void launch_split_attention_int8s_tc(const AttnShape& shape, const SplitWork* work, int n_work, const float* q,
                                     Partials partials, const Int8sKernelOptions& opt, float scale_log2,
                                     cudaStream_t stream) {
  if (!int8s_tc_supports_group(shape.group)) throw InvalidArgument(tc_group_error(shape.group));
  if (shape.head_dim != 64 && shape.head_dim != 256)  // any other would run the 64-channel kernel on it
    throw InvalidArgument("int8s tc kernel: head_dim must be 64 or 256, got " + std::to_string(shape.head_dim));
  if (shape.split_tokens > kMaxTcSplit)
    throw InvalidArgument("int8s tc kernel: split_tokens must be at most " + std::to_string(kMaxTcSplit) + ", got " +
                          std::to_string(shape.split_tokens));
  const Int8sTcConfig r = resolve_int8s_tc_config(opt.tc, shape.head_dim);
  const Cfg c{r.warps, r.stages, r.blocks, r.channel_rows, r.single_v};
  if (shape.head_dim == 256) launch_tc_group<256>(c, shape, work, n_work, q, partials, scale_log2, opt, stream);
  else launch_tc_group<64>(c, shape, work, n_work, q, partials, scale_log2, opt, stream);
  check_cuda(cudaGetLastError(), "int8s_tc_kernel launch");
}

}  // namespace activekv::cuda
