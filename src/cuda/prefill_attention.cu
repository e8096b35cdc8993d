// Flash-style chunked prefill attention over a paged BF16 history.
// Contract: include/activekv/cuda/prefill.h; geometry: prefill_kernel.h.
//
// CTA = a tile of BM consecutive query rows x ALL `group` query heads of ONE
// KV head (x one key split, see below). The CTA's 16 * W mma rows hold the
// (row, head) pairs row-major -- pair m is query row m / group, head m % group
// -- so every group size fills the 16-row mma tiles (group 6, W = 8: BM = 21
// rows, 126 of 128 mma rows used) and each K/V block is read from memory once
// for the whole group, and once for all BM rows. Warp w owns pairs
// [16w, 16w + 16). Keys stream in blocks of 32 tokens through a CTA-wide
// cp.async ring (S stages, 16-byte chunks XOR-swizzled by token row so that
// ldmatrix is conflict-free); each token row is fetched from its own page, so
// any page size works and pages may lie anywhere. Per block and warp:
//
//   S[16 x 32] = Q[16 x HD] . K^T     m16n8k16; Q pre-scaled by scale*log2(e)
//                                     and split into NT bf16 terms (smallest
//                                     first into one fp32 accumulator); K exact
//   causal mask (only blocks that reach past the warp's first position)
//   online softmax in base 2 (4 lanes per row, fixed-order butterflies)
//   O[16 x HD] += P[16 x 32] . V      P as NT bf16 terms: the S accumulator
//                                     fragment IS the A fragment of P (no
//                                     shuffles); V via ldmatrix.trans
//
// then O / l (fp32) and LSE = (m + log2 l) ln 2 are written. Query fragments
// are built once per CTA into shared memory (each warp its own 16 rows, in
// fragment order: one 16-byte load per lane per k-step and term).
//
// Sliding window: with window > 0, row p attends keys (p - window, p] only;
// the CTA starts at the block holding its first row's first visible key and
// masks per row, and a warp skips blocks wholly before its rows' windows.
// Every key read lies at or after that block's start: within the last
// window + chunk tokens, which a ring of pages holds (the runtime's sliding
// layers).
//
// Key segments: with key_end set, no key at or past it is read (zero-filled)
// or attended -- a segment of history before the chunk, every key visible to
// every row (PrefillAttention::run_keys).
//
// Split-K: with n_splits > 1, CTA z handles keys [z * split_keys, (z+1) *
// split_keys) (multiples of the block) and writes a partial (O, LSE) that
// launch_merge combines; rows with no visible key in a split write LSE -inf.
// Keys past the CTA's last needed key are zero-filled (never read from the
// pages: slots past the history end may hold anything, NaN included, and
// 0 * NaN would poison P.V). No atomics, fixed reduction orders: bitwise
// repeatable for the same inputs and launch geometry.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "activekv/cuda/decode_attention.h"
#include "mma_util.cuh"
#include "prefill_kernel.h"

namespace activekv::cuda::prefill_detail {
namespace {

using namespace ::activekv::cuda::detail;

template <int HD, int NT>
__global__ void __launch_bounds__(warps(HD, NT) * 32, 1) prefill_attention_kernel(const KernelArgs a) {
  constexpr int W = warps(HD, NT);
  constexpr int T = W * 32;
  constexpr int S = stages(HD, NT);
  constexpr int KB = kKeyBlock;
  constexpr int KS = HD / 16;   // k-steps of Q.K^T = n-tile pairs of P.V
  constexpr int CH = HD / 8;    // 16-byte chunks per K/V row
  constexpr int NTS = KB / 8;   // score n-tiles per block
  constexpr uint32_t PLANE = KB * HD * 2;  // K (or V) rows of one block
  constexpr uint32_t STAGE = 2 * PLANE;
  static_assert(STAGE == stage_bytes(HD), "stage layout");
  static_assert(T % CH == 0 && (KB * CH) % T == 0, "every thread copies whole rows' chunk c");
  static_assert(S >= 2, "double buffering at least");
  extern __shared__ __align__(128) unsigned char smem[];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q4 = lane & 3;
  const int group = a.group, nq = a.n_kv * group;
  const int bm = 16 * W / group;
  const int tile = int(gridDim.x) - 1 - int(blockIdx.x);  // longest (latest) rows start first
  const int h = blockIdx.y, split = blockIdx.z;
  const int r0 = tile * bm;
  const int rows = min(bm, a.n_rows - r0);
  const int m_valid = rows * group;  // (row, head) pairs in use
  const int p_first = a.pos0 + r0, p_last = p_first + rows - 1;
  const int split_begin = split * a.split_keys;
  // A window moves the start up to the block of the first row's first visible key (never the split's end).
  const int k_begin = a.window > 0 ? max(split_begin, max(0, p_first - a.window + 1) / KB * KB) : split_begin;
  const int k_end =
      min(a.key_end, a.n_splits == 1 ? p_last + 1 : min(p_last + 1, split_begin + a.split_keys));
  const int n_blk = k_end > k_begin ? (k_end - k_begin + KB - 1) / KB : 0;

  // This lane's two mma rows: pairs 16w + g and 16w + g + 8. Pairs past the
  // tile (padding) compute with q = 0 at the tile's last position (finite,
  // never written).
  bool valid[2];
  int pos[2], row[2], qh[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int m = 16 * warp + g + 8 * i;
    valid[i] = m < m_valid;
    const int mm = valid[i] ? m : m_valid - 1;
    const int rr = mm / group;
    row[i] = r0 + rr;
    qh[i] = h * group + (mm - rr * group);
    pos[i] = p_first + rr;
  }
  const bool warp_active = 16 * warp < m_valid;
  const int warp_pmin = p_first + min(16 * warp, m_valid - 1) / group;
  const int warp_pmax = p_first + min(16 * warp + 15, m_valid - 1) / group;

  // K/V block `it` -> ring stage it % S. Token rows past k_end are zero-filled.
  const uint16_t* const* pages = reinterpret_cast<const uint16_t* const*>(a.pages);
  const size_t k_head = size_t(a.head0 + h) * a.page_size * HD;
  const size_t v_plane = size_t(a.page_heads) * a.page_size * HD;
  const uint32_t sbase = smem_u32(smem);
  const int cc = threadIdx.x % CH, rr0 = threadIdx.x / CH;
  auto issue = [&](int it) {
    const int t0 = k_begin + it * KB;
    const uint32_t sk = sbase + uint32_t(it % S) * STAGE;
#pragma unroll
    for (int i = 0; i < KB * CH / T; ++i) {
      const int r = rr0 + i * (T / CH);
      const bool ok = t0 + r < k_end;
      const int t = ok ? t0 + r : t0;
      const int pg = t / a.page_size;
      const uint16_t* kp = pages[pg] + k_head + size_t(t - pg * a.page_size) * HD + cc * 8;
      const uint32_t so = uint32_t(r * CH + (cc ^ (r & 7))) * 16;
      cp_async16(sk + so, kp, ok ? 16 : 0);
      cp_async16(sk + PLANE + so, kp + v_plane, ok ? 16 : 0);
    }
  };
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < n_blk) issue(s);
    cp_async_commit();
  }

  // Query A fragments (pre-scaled to base 2, NT bf16 terms) of this warp's 16
  // rows: qs[(k-step * NT + term) * 32 + lane] = {a0, a1, a2, a3}.
  uint4* qs = reinterpret_cast<uint4*>(smem + size_t(S) * STAGE) + size_t(warp) * KS * NT * 32;
  {
    const float* qr0 = a.q + (size_t(row[0]) * nq + qh[0]) * HD;
    const float* qr1 = a.q + (size_t(row[1]) * nq + qh[1]) * HD;
    const float2 zero = make_float2(0.f, 0.f);
#pragma unroll 2
    for (int kk = 0; kk < KS; ++kk) {
      const int c = 16 * kk + 2 * q4;
      const float2 x0 = valid[0] ? *reinterpret_cast<const float2*>(qr0 + c) : zero;      // row g, c
      const float2 x1 = valid[1] ? *reinterpret_cast<const float2*>(qr1 + c) : zero;      // row g+8, c
      const float2 x2 = valid[0] ? *reinterpret_cast<const float2*>(qr0 + c + 8) : zero;  // row g, c+8
      const float2 x3 = valid[1] ? *reinterpret_cast<const float2*>(qr1 + c + 8) : zero;  // row g+8, c+8
      uint32_t t0[NT], t1[NT], t2[NT], t3[NT];
      split_bf16<NT>(x0.x * a.scale_log2, x0.y * a.scale_log2, t0);
      split_bf16<NT>(x1.x * a.scale_log2, x1.y * a.scale_log2, t1);
      split_bf16<NT>(x2.x * a.scale_log2, x2.y * a.scale_log2, t2);
      split_bf16<NT>(x3.x * a.scale_log2, x3.y * a.scale_log2, t3);
#pragma unroll
      for (int e = 0; e < NT; ++e) qs[(kk * NT + e) * 32 + lane] = make_uint4(t0[e], t1[e], t2[e], t3[e]);
    }
  }
  // (Each warp reads only its own fragments, after the __syncthreads below.)

  float o[2 * KS][4];  // O: n-tile j = channels 8j..8j+7
#pragma unroll
  for (int j = 0; j < 2 * KS; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) o[j][i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};  // l_run: this lane's columns only
  // ldmatrix lane addressing. K (non-trans): matrix i = (tokens 0-7 | 8-15) x
  // (chunk +0 | +1) for i = (0, 1 | 2, 3) -> b0, b1 of n-tiles 2np, 2np+1.
  // V (trans): matrix i = (tokens 0-7 | 8-15) x (chunk +0) for i = 0, 1, then
  // chunk +1 for i = 2, 3 -> b0, b1 of n-tiles 2j, 2j+1.
  const int kr = ((lane >> 4) << 3) + (lane & 7), kc = (lane >> 3) & 1;
  const int vr = lane & 15, vc = lane >> 4;

  for (int it = 0; it < n_blk; ++it) {
    cp_async_wait<S - 2>();  // this thread's copies of block `it` have landed
    __syncthreads();         // ... everyone's; and everyone is done with block it-1
    if (it + S - 1 < n_blk) issue(it + S - 1);  // into the stage block it-1 used
    cp_async_commit();
    const int t0 = k_begin + it * KB;
    if (!warp_active || t0 > warp_pmax) continue;  // warp-uniform: every key masked
    if (a.window > 0 && t0 + KB - 1 <= warp_pmin - a.window) continue;  // every key before the warp's windows
    const uint32_t sk = sbase + uint32_t(it % S) * STAGE, sv = sk + PLANE;

    float s[NTS][4];
#pragma unroll
    for (int nt = 0; nt < NTS; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) s[nt][i] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
      uint32_t qa[NT][4];
#pragma unroll
      for (int e = 0; e < NT; ++e) {
        const uint4 v = qs[(kk * NT + e) * 32 + lane];
        qa[e][0] = v.x; qa[e][1] = v.y; qa[e][2] = v.z; qa[e][3] = v.w;
      }
#pragma unroll
      for (int np = 0; np < KB / 16; ++np) {
        uint32_t b[4];
        ldsm_x4(b, sk + uint32_t((16 * np + kr) * CH + ((2 * kk + kc) ^ (kr & 7))) * 16);
#pragma unroll
        for (int e = NT - 1; e >= 0; --e) {
          mma_bf16_full(s[2 * np], qa[e], b[0], b[1]);
          mma_bf16_full(s[2 * np + 1], qa[e], b[2], b[3]);
        }
      }
    }
    // Causal diagonal, or the end of the keys (history end, or a segment's
    // key_end that does not fall on a block boundary), inside this block.
    // Without key_end, a key >= k_end is also past every row's position, so
    // the second test changes nothing for causal runs.
    // With a window, also its start: a key at or before p - window.
    if (t0 + KB - 1 > warp_pmin || t0 + KB > k_end || (a.window > 0 && t0 <= warp_pmax - a.window)) {
#pragma unroll
      for (int nt = 0; nt < NTS; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int t = t0 + 8 * nt + 2 * q4 + (i & 1);
          if (t > pos[i >> 1] || t >= k_end || (a.window > 0 && t <= pos[i >> 1] - a.window)) s[nt][i] = -INFINITY;
        }
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float bmx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < NTS; ++nt) bmx = fmaxf(bmx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
      bmx = fmaxf(bmx, __shfl_xor_sync(0xffffffffu, bmx, 1));
      bmx = fmaxf(bmx, __shfl_xor_sync(0xffffffffu, bmx, 2));
      const float mx = fmaxf(m_run[r], bmx);
      const bool none = mx == -INFINITY;  // no visible key yet (a split before the row's position)
      alpha[r] = none ? 1.f : exp2f(m_run[r] - mx);  // m_run = -inf -> 0
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < NTS; ++nt)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const float p = none ? 0.f : exp2f(s[nt][2 * r + j] - mx);  // masked: exp2(-inf) = 0
          s[nt][2 * r + j] = p;
          sum += p;
        }
      l_run[r] = fmaf(l_run[r], alpha[r], sum);
      m_run[r] = mx;
    }
    // Rescale O only when some row's factor is not exactly 1 (rare once the maxima settle).
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int j = 0; j < 2 * KS; ++j) {
        o[j][0] *= alpha[0]; o[j][1] *= alpha[0]; o[j][2] *= alpha[1]; o[j][3] *= alpha[1];
      }
    }
#pragma unroll
    for (int kp = 0; kp < KB / 16; ++kp) {
      // A fragment of P (keys 16kp..16kp+15) from score n-tiles 2kp, 2kp+1.
      uint32_t t0[NT], t1[NT], t2[NT], t3[NT], pa[NT][4];
      split_bf16<NT>(s[2 * kp][0], s[2 * kp][1], t0);          // row g,   keys 2q4, +1
      split_bf16<NT>(s[2 * kp][2], s[2 * kp][3], t1);          // row g+8, keys 2q4, +1
      split_bf16<NT>(s[2 * kp + 1][0], s[2 * kp + 1][1], t2);  // row g,   keys 8+2q4, +1
      split_bf16<NT>(s[2 * kp + 1][2], s[2 * kp + 1][3], t3);  // row g+8, keys 8+2q4, +1
#pragma unroll
      for (int e = 0; e < NT; ++e) {
        pa[e][0] = t0[e]; pa[e][1] = t1[e]; pa[e][2] = t2[e]; pa[e][3] = t3[e];
      }
#pragma unroll
      for (int j = 0; j < KS; ++j) {
        uint32_t b[4];
        ldsm_x4_t(b, sv + uint32_t((16 * kp + vr) * CH + ((2 * j + vc) ^ (vr & 7))) * 16);
#pragma unroll
        for (int e = NT - 1; e >= 0; --e) {
          mma_bf16_full(o[2 * j], pa[e], b[0], b[1]);
          mma_bf16_full(o[2 * j + 1], pa[e], b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait<0>();

  // Row sums over the row's 4 lanes (butterfly: the same bits in all 4).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  if (a.n_splits > 1 && split == 0 && h == 0)
    for (int i = threadIdx.x; i < rows; i += T) a.row_splits[r0 + i] = a.n_splits;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!valid[r]) continue;
    const bool empty = m_run[r] == -INFINITY;  // only in a split that ends before this row's keys begin
    float* dst;
    float* lse;
    if (a.n_splits > 1) {
      const size_t pr = (size_t(row[r]) * a.n_splits + split) * nq + qh[r];
      dst = a.part_o + pr * HD;
      lse = a.part_lse + pr;
    } else {
      const size_t orow = size_t(row[r]) * nq + qh[r];
      dst = a.out + orow * HD;
      lse = a.out_lse ? a.out_lse + orow : nullptr;
    }
    const float l = l_run[r];
#pragma unroll
    for (int j = 0; j < 2 * KS; ++j) {
      const float2 v = empty ? make_float2(0.f, 0.f) : make_float2(o[j][2 * r] / l, o[j][2 * r + 1] / l);
      *reinterpret_cast<float2*>(dst + 8 * j + 2 * q4) = v;
    }
    if (q4 == 0 && lse) *lse = empty ? -INFINITY : (m_run[r] + log2f(l)) * kLn2;
  }
}

template <int HD, int NT>
int configure_t() {
  constexpr size_t smem = smem_bytes(HD, NT);
  static_assert(smem <= kMaxSmem, "shared memory");
  check_cuda(cudaFuncSetAttribute(prefill_attention_kernel<HD, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  int(smem)),
             "cudaFuncSetAttribute(prefill_attention_kernel)");
  int n = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, prefill_attention_kernel<HD, NT>, warps(HD, NT) * 32,
                                                           smem),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor(prefill_attention_kernel)");
  return n;
}

template <int HD, int NT>
void launch_t(const KernelArgs& a, cudaStream_t st) {
  const int bm = block_rows(HD, NT, a.group);
  const dim3 grid(unsigned((a.n_rows + bm - 1) / bm), unsigned(a.n_kv), unsigned(a.n_splits));
  prefill_attention_kernel<HD, NT><<<grid, warps(HD, NT) * 32, smem_bytes(HD, NT), st>>>(a);
}

struct Entry {
  int hd, terms;
  int (*configure)();
  void (*launch)(const KernelArgs&, cudaStream_t);
};
constexpr Entry kEntries[] = {
    {64, 1, configure_t<64, 1>, launch_t<64, 1>},    {64, 2, configure_t<64, 2>, launch_t<64, 2>},
    {64, 3, configure_t<64, 3>, launch_t<64, 3>},    {128, 1, configure_t<128, 1>, launch_t<128, 1>},
    {128, 2, configure_t<128, 2>, launch_t<128, 2>}, {128, 3, configure_t<128, 3>, launch_t<128, 3>},
    {256, 1, configure_t<256, 1>, launch_t<256, 1>}, {256, 2, configure_t<256, 2>, launch_t<256, 2>},
    {256, 3, configure_t<256, 3>, launch_t<256, 3>},
};

const Entry& entry(int hd, int terms) {
  for (const Entry& e : kEntries)
    if (e.hd == hd && e.terms == terms) return e;
  throw InvalidArgument("prefill attention: no kernel for head_dim " + std::to_string(hd) + " with " +
                        std::to_string(terms) + " bf16 terms (head_dim 64, 128, 256; terms 1..3)");
}

}  // namespace

int configure_kernel(int head_dim, int terms) { return entry(head_dim, terms).configure(); }

void launch_kernel(const KernelArgs& a, int head_dim, int terms, cudaStream_t stream) {
  entry(head_dim, terms).launch(a, stream);
  check_cuda(cudaGetLastError(), "prefill_attention_kernel launch");
}

}  // namespace activekv::cuda::prefill_detail
