// Paged BF16 decode attention (split kernel) and the SPEC §4 merge.
// See include/activekv/cuda/decode_attention.h for the contract.
//
// Split kernel (tensor cores, mma.sync m16n8k16 bf16): one CTA = one split x
// one KV head; the group's query heads are the rows of the M dimension, so each
// K/V byte is read once for the whole group. The fp32 query and softmax weights
// enter the tensor cores as three bf16 terms (hi + mid + lo, ~24 bits), K/V are
// exact bf16, accumulation is fp32: results agree with an fp32/fp64 reference
// to fp32 tolerance. Online softmax in base 2; warp states merge in fixed order;
// no atomics, so outputs are bitwise repeatable. Details at the kernel.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "activekv/cuda/decode_attention.h"
#include "mma_util.cuh"
#include "once_per_device.h"
#include "pdl.cuh"
#include "split_tail.cuh"
#include "quant_x.cuh"

namespace activekv::cuda {

void check_cuda(int status, const char* what) {
  if (status != cudaSuccess) {
    // Cleared, so the next launch check does not report this call's error
    // (a later request's kernel blamed for it); a sticky error stays anyway.
    (void)cudaGetLastError();
    throw CudaError(std::string(what) + ": " +
                    cudaGetErrorString(static_cast<cudaError_t>(status)));
  }
}

std::string gpu_absence_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n > 0) return "";
  cudaGetLastError();
  // The driver's words for a machine without one ("CUDA driver version is
  // insufficient") mislead: say what is missing first.
  const std::string why = e == cudaErrorInsufficientDriver ? "no NVIDIA driver, or one older than this build's CUDA"
                          : e == cudaErrorNoDevice || e == cudaSuccess ? "no NVIDIA GPU found"
                                                                        : cudaGetErrorString(e);
  return why + " (cudaGetDeviceCount: " + (e == cudaSuccess ? std::string("0 devices") : cudaGetErrorName(e)) + ")";
}

void require_gpu(int device, const std::string& who) {
  const std::string absent = gpu_absence_reason();
  if (!absent.empty()) throw CudaError(who + ": no usable CUDA GPU on this machine: " + absent);
  int n = 0;
  check_cuda(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
  if (device < 0 || device >= n)
    throw InvalidArgument(who + ": GPU " + std::to_string(device) + " does not exist (" + std::to_string(n) +
                          " found)");
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
}

int default_split_tokens(int page_size) {
  if (page_size <= 0) throw InvalidArgument("default_split_tokens: page_size must be positive, got " +
                                            std::to_string(page_size));
  for (int s = std::min(page_size, 512); s > 1; --s)
    if (page_size % s == 0) return s;
  return 1;
}

void AttnShape::validate() const {
  auto bad = [](const std::string& m) { throw InvalidArgument("AttnShape: " + m); };
  if (n_kv_heads <= 0) bad("n_kv_heads must be positive, got " + std::to_string(n_kv_heads));
  if (group < 1 || group > 8) bad("group (query heads per KV head) must be 1..8, got " + std::to_string(group));
  if (head_dim != 64 && head_dim != 128 && head_dim != 256)
    bad("head_dim must be 64, 128 or 256, got " + std::to_string(head_dim));
  if (page_size <= 0) bad("page_size must be positive, got " + std::to_string(page_size));
  if (split_tokens <= 0 || page_size % split_tokens != 0)
    bad("split_tokens must divide page_size (" + std::to_string(page_size) + "), got " +
        std::to_string(split_tokens));
  if (!(softmax_scale >= 0.f) || std::isinf(softmax_scale)) bad("softmax_scale must be finite and >= 0");
  if (kv_head0 < 0 || page_kv_heads < 0) bad("kv_head0 and page_kv_heads must be >= 0");
  if (kv_head0 + n_kv_heads > page_heads())
    bad("KV heads [" + std::to_string(kv_head0) + ", " + std::to_string(kv_head0 + n_kv_heads) +
        ") do not lie in a page of " + std::to_string(page_heads()) + " heads");
}

namespace {

using namespace detail;  // mma_util.cuh: cp.async, ldmatrix, mma, bf16 term split

constexpr int kBlk = 16;     // tokens per mma block (k of P.V, 2 n-tiles of Q.K^T)
constexpr int kRows = 8;     // query heads per KV head in the mma M dimension (Q.K^T puts the mid query term in rows 8..15)

// W warps per CTA, each with an ST-block cp.async ring:
//   head_dim 64, 128: 4 warps x 3 stages;
//   head_dim 256:     2 warps x 3 stages (96 KiB of ring per CTA, 2 CTAs per SM
//                     so that one CTA's start/end overlaps the other's streaming).
// 3 warps x 2 stages at head_dim 256 (the same ring, 6 warps per SM instead of
// 4) measured no faster on an H100: 128K 1.006x, 32K 1.021x
// (bench/results/h100_split_warps_ab_ab036f5.json).
template <int HD> struct SplitLaunch { static constexpr int W = HD >= 256 ? 2 : 4, ST = 3; };
template <int HD> __host__ __device__ constexpr int stage_bytes() { return 2 * kBlk * HD * 2; }  // K and V rows of one block
template <int HD, int W>
constexpr size_t merge_bytes() {
  return size_t(W) * kRows * HD * 4 + 2 * size_t(W) * kRows * 4 + kRows * sizeof(split_tail::HeadMerge<W>);
}
template <int HD, int W, int ST>
constexpr size_t split_smem_bytes() {
  const size_t ring = size_t(W) * ST * stage_bytes<HD>();
  const size_t qfrag = size_t(HD / 16) * 2 * 3 * 32 * 4;  // after the ring, not aliased
  static_assert(HD == 64 || HD == 128 || HD == 256, "instantiated head dims");
  static_assert(merge_bytes<HD, W>() <= size_t(W) * ST * stage_bytes<HD>(),
                "the merge area must fit in the ring it aliases (the query fragments follow the ring)");
  return ring + qfrag;
}

// Tensor-core split kernel. CTA = one split x one KV head, W warps; warp w
// handles the split's 16-token blocks w, w+W, ... through its own cp.async ring
// (K and V rows of a block, XOR-swizzled 16-byte chunks so that ldmatrix is
// conflict-free). Per block:
//   S[8 heads x 16 tok] = Q[heads x HD] . K^T    (m16n8k16, heads in M, Q as
//                          3 bf16 terms -> fp32-accurate scores, base 2; the
//                          hi and mid terms share one mma's 16 rows)
//   online softmax per head (4 lanes per head, fixed-order reductions)
//   O^T[HD x 8 heads]  += V^T[HD x 16 tok] . P^T  (P as 3 bf16 terms; the
//                          score C-fragment IS the P^T B-fragment: no shuffles)
// The W warp states merge in shared memory in fixed order. No atomics: bitwise repeatable.
template <int HD, int W, int ST>
__global__ void __launch_bounds__(W * 32, 1)
split_attention_kernel(const SplitWork* __restrict__ work, const float* __restrict__ q,
                       float* __restrict__ part_o, float* __restrict__ part_lse, int max_splits,
                       int n_kv, int group, int page_size, float scale_log2, int head0, int page_heads) {
  constexpr int KS = HD / 16;  // k-steps of Q.K^T = m-tiles of V^T.P^T
  constexpr int CH = HD / 8;   // 16-byte chunks per row
  constexpr int SB = stage_bytes<HD>();
  extern __shared__ __align__(128) unsigned char smem[];
  pdl::begin();
  const SplitWork w = work[blockIdx.x];
  const int h = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nq = n_kv * group;
  const int g = lane >> 2, q4 = lane & 3;  // this lane's score row (head) and column pair

  // The page's head head0 + h (a head shard reads its heads of the full page).
  const uint16_t* kp = static_cast<const uint16_t*>(w.page) + (size_t(head0 + h) * page_size + w.tok0) * HD;
  const uint16_t* vp = kp + size_t(page_heads) * page_size * HD;
  const uint32_t ring = smem_u32(smem) + uint32_t(warp) * ST * SB;
  const int nblk = (w.ntok + kBlk - 1) / kBlk;
  const int n_it = warp < nblk ? (nblk - warp + W - 1) / W : 0;

  auto issue = [&](int it) {
    const uint32_t sk = ring + uint32_t(it % ST) * SB, sv = sk + kBlk * HD * 2;
    const int t0 = (warp + it * W) * kBlk;
#pragma unroll
    for (int i = 0; i < kBlk * CH / 32; ++i) {
      const int idx = lane + 32 * i;
      const int r = idx / CH, c = idx % CH;
      const bool ok = t0 + r < w.ntok;
      const size_t off = size_t(ok ? t0 + r : t0) * HD + c * 8;
      const uint32_t so = uint32_t(r * CH + (c ^ (r & 7))) * 16;
      cp_async16(sk + so, kp + off, ok ? 16 : 0);
      cp_async16(sv + so, vp + off, ok ? 16 : 0);
    }
  };
#pragma unroll
  for (int i = 0; i < ST - 1; ++i) {
    if (i < n_it) issue(i);
    cp_async_commit();
  }

  // Q fragments (A operand, row g = head g of the group), pre-scaled to
  // base 2, as 3 bf16 terms; the same for every warp, so kept once per CTA
  // in shared memory after the ring: [k][lane] {hi, mid} A fragments (hi in
  // rows 0..7, mid in rows 8..15), then [k][lane] lo (rows 8..15 zero).
  using HeadMerge = split_tail::HeadMerge<W>;
  uint32_t* sm_q = reinterpret_cast<uint32_t*>(smem + size_t(W) * ST * SB);
  {
    // Warp w takes fragments e = w, w + W, ...: all of its query loads are
    // issued before the first is used. A loop that loaded, split and stored
    // one fragment at a time could wait KS * 2 / W round trips in a row; at
    // depth 0 (~36 tokens) the kernel took 12.4 us under ncu at f1a889e.
    static_assert(KS * 2 % W == 0, "the fragments divide among the warps");
    constexpr int E = KS * 2 / W;
    const bool gv = g < group;
    const float* qrow = q + (size_t(w.seq) * nq + size_t(h) * group + (gv ? g : 0)) * HD;
    float2 xq[E];
#pragma unroll
    for (int i = 0; i < E; ++i) {
      const int e = warp + i * W;
      const int c = 16 * (e >> 1) + 8 * (e & 1) + 2 * q4;
      float x0 = qrow[c], x1 = qrow[c + 1];  // in bounds for every lane (qrow is head 0's when !gv)
      asm volatile("" : "+f"(x0), "+f"(x1));  // loaded by every lane, not sunk into a branch on gv
      xq[i] = gv ? make_float2(x0 * scale_log2, x1 * scale_log2) : make_float2(0.f, 0.f);
    }
#pragma unroll
    for (int i = 0; i < E; ++i) {
      const int e = warp + i * W;
      uint32_t t[3];
      split3(xq[i].x, xq[i].y, t);
      const int k = e >> 1, half = e & 1;
      sm_q[(k * 32 + lane) * 4 + 2 * half] = t[0];
      sm_q[(k * 32 + lane) * 4 + 2 * half + 1] = t[1];
      sm_q[KS * 32 * 4 + (k * 32 + lane) * 2 + half] = t[2];
    }
  }
  __syncthreads();

  float m_run = -INFINITY, l_run = 0.f;  // head g; l_run: this lane's columns only
  float oacc[KS][4];                     // O^T: (ch 16mt+g [+8], heads 2q4, 2q4+1)
#pragma unroll
  for (int mt = 0; mt < KS; ++mt)
#pragma unroll
    for (int i = 0; i < 4; ++i) oacc[mt][i] = 0.f;
  // ldmatrix addressing: lanes 8i..8i+7 give the rows of matrix i =
  // (tokens 0-7 | 8-15) x (chunk +0 | +1).
  const int lr = ((lane >> 4) << 3) + (lane & 7);
  const int lc = (lane >> 3) & 1;

  for (int it = 0; it < n_it; ++it) {
    if (it + ST - 1 < n_it) issue(it + ST - 1);
    cp_async_commit();
    cp_async_wait<ST - 1>();
    __syncwarp();  // every lane's copies of this stage are visible to the whole warp
    const uint32_t sk = ring + uint32_t(it % ST) * SB, sv = sk + kBlk * HD * 2;
    const int nvalid = min(kBlk, w.ntok - (warp + it * W) * kBlk);

    // Score terms per query term: hi, mid, lo accumulated apart, summed lo +
    // mid + hi. hi in rows 0..7 and mid in rows 8..15 of one mma (a row's sum
    // does not depend on the other rows, so each term keeps the bits of an
    // mma of its own), lo in a second: 4 mma per k-step, not 6, and 2 shared
    // loads, not 6 -- 0.98-0.99x the step of one mma per term at 128K on an
    // H100, bitwise equal (bench/results/h100_split_qk_ab_ab036f5.json).
    float s[2][2];
    float shm[2][4], slo[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) shm[nt][i] = slo[nt][i] = 0.f;
    const uint4* q_hm = reinterpret_cast<const uint4*>(sm_q);
    const uint2* q_lo = reinterpret_cast<const uint2*>(sm_q + KS * 32 * 4);
#pragma unroll
    for (int k = 0; k < KS; ++k) {
      uint32_t b[4];
      ldsm_x4(b, sk + uint32_t(lr * CH + ((2 * k + lc) ^ (lr & 7))) * 16);
      const uint4 hm = q_hm[k * 32 + lane];
      const uint2 lo = q_lo[k * 32 + lane];
      const uint32_t a[4] = {hm.x, hm.y, hm.z, hm.w};
      mma_bf16_full(shm[0], a, b[0], b[1]);
      mma_bf16_full(shm[1], a, b[2], b[3]);
      mma_bf16(slo[0], lo.x, lo.y, b[0], b[1]);
      mma_bf16(slo[1], lo.x, lo.y, b[2], b[3]);
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float v = (slo[nt][j] + shm[nt][2 + j]) + shm[nt][j];
        s[nt][j] = nt * 8 + 2 * q4 + j < nvalid ? v : -INFINITY;
      }
    float p[2][2];
    const float alpha = online_softmax_block(s, m_run, l_run, p);
    // Rescale O^T (columns = heads 2q4, 2q4+1) only when some factor is not exactly 1.
    if (__any_sync(0xffffffffu, alpha != 1.f)) {
      const float a0 = __shfl_sync(0xffffffffu, alpha, (2 * q4) * 4);
      const float a1 = __shfl_sync(0xffffffffu, alpha, (2 * q4 + 1) * 4);
#pragma unroll
      for (int mt = 0; mt < KS; ++mt) {
        oacc[mt][0] *= a0; oacc[mt][1] *= a1; oacc[mt][2] *= a0; oacc[mt][3] *= a1;
      }
    }
    uint32_t pb[2][3];
    split3(p[0][0], p[0][1], pb[0]);
    split3(p[1][0], p[1][1], pb[1]);
#pragma unroll
    for (int mt = 0; mt < KS; ++mt) {
      uint32_t a[4];
      ldsm_x4_t(a, sv + uint32_t(lr * CH + ((2 * mt + lc) ^ (lr & 7))) * 16);
#pragma unroll
      for (int sp = 2; sp >= 0; --sp) mma_bf16_full(oacc[mt], a, pb[0][sp], pb[1][sp]);
    }
    __syncwarp();  // all lanes done reading this stage before it is refilled
  }
  cp_async_wait<0>();
  // Row sum over the 4 lanes of head g, butterfly (same bits in all 4 lanes).
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);
  __syncthreads();  // the merge area below aliases every warp's ring

  float* sm_acc = reinterpret_cast<float*>(smem);  // [W][kRows][HD]
  float* sm_m = sm_acc + size_t(W) * kRows * HD;   // [W][kRows]
  float* sm_l = sm_m + W * kRows;                  // [W][kRows]
  HeadMerge* sm_hm = reinterpret_cast<HeadMerge*>(sm_l + W * kRows);  // [kRows]
  if (q4 == 0) { sm_m[warp * kRows + g] = m_run; sm_l[warp * kRows + g] = l_run; }
#pragma unroll
  for (int mt = 0; mt < KS; ++mt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int ch = 16 * mt + g + (i >= 2 ? 8 : 0), hd_row = 2 * q4 + (i & 1);
      sm_acc[(size_t(warp) * kRows + hd_row) * HD + ch] = oacc[mt][i];
    }
  __syncthreads();

  const size_t base = (size_t(w.seq) * max_splits + w.split) * nq + size_t(h) * group;
  // The merge weights of a head are computed once (split_tail.cuh), then
  // every output is W products: the tail is on the critical path at short
  // depths (4 CTAs at depth 0). Writing the output itself when a history is
  // one split (no merge launch) was slower on the H200 -- depth 0 1.55
  // against 1.50 ms/token, and 32K, where it is not taken, 2.03 against 2.00
  // from the extra arguments (bench/results/h200_ab_direct_output_f18ad24.json);
  // likely (not profiled) because the merge spreads this work over 192 CTAs.
  if (threadIdx.x < group) {
    const HeadMerge hm = split_tail::head_merge<W>(sm_m + threadIdx.x, sm_l + threadIdx.x, kRows);
    sm_hm[threadIdx.x] = hm;
    part_lse[base + threadIdx.x] = split_tail::merged_lse(hm, kLn2);
  }
  __syncthreads();
#pragma unroll 4
  for (int idx = threadIdx.x; idx < group * HD; idx += W * 32) {
    const int gg = idx / HD, c = idx % HD;
    part_o[(base + gg) * HD + c] = split_tail::merged_output<W>(sm_hm[gg], sm_acc + size_t(gg) * HD + c, kRows * HD);
  }
}

// Merge: grid (n_seq, n_q_heads, HD / 32), 256 threads = 8 warps x 32 channels.
// Weights exp(LSE_j - M) are computed once per CTA into shared memory; warp r
// sums splits r, r+8, ... of its channel, then the 8 partial sums are added in
// fixed order (r = 0..7): same bits every run, and the dependent chain per
// thread is n/8 long instead of n. Empty partials (weight 0) are never read.
constexpr int kMergeThreads = 256;
constexpr int kMergeCh = 32;  // a CTA's channels: one int8 block of the output row (quant_x.cuh)
constexpr int kMergeWays = kMergeThreads / kMergeCh;
__global__ void __launch_bounds__(kMergeThreads)
merge_kernel(const float* __restrict__ part_o, const float* __restrict__ part_lse, int max_splits,
             const int32_t* __restrict__ n_splits, int nq, int hd, float* __restrict__ out,
             float* __restrict__ out_lse, int8_t* __restrict__ out_codes, float2* __restrict__ out_scales) {
  extern __shared__ float wts[];  // [max_splits]
  __shared__ float red[kMergeThreads / 32];
  __shared__ float red_l[kMergeWays], red_o[kMergeWays][kMergeCh];
  pdl::begin();
  const int s = blockIdx.x, h = blockIdx.y;
  const int cl = threadIdx.x % kMergeCh, way = threadIdx.x / kMergeCh;
  const int c = blockIdx.z * kMergeCh + cl;
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
#pragma unroll 4
  for (int j = way; j < n; j += kMergeWays) {
    const float wj = wts[j];
    const float oj = wj != 0.f ? __ldg(o + size_t(j) * nq * hd) : 0.f;
    L += wj;
    O = fmaf(wj, oj, O);
  }
  if (cl == 0) red_l[way] = L;
  red_o[way][cl] = O;
  __syncthreads();
  if (way == 0) {
    L = red_l[0];
    O = red_o[0][cl];
#pragma unroll
    for (int r = 1; r < kMergeWays; ++r) { L += red_l[r]; O += red_o[r][cl]; }
    // L is 0 only when every partial is empty; a poisoned (NaN) partial --
    // a failed CPU share -- makes L NaN and must reach the output as NaN, not
    // as an empty row's zeros (fmaxf above drops NaN from M).
    const bool empty = L == 0.f;
    const float v[1] = {empty ? 0.f : O / L};
    out[(size_t(s) * nq + h) * hd + c] = v[0];
    if (out_lse && c == 0) out_lse[size_t(s) * nq + h] = empty ? -INFINITY : M + logf(L);
    if (out_codes) {  // this warp's 32 channels are one block of the row: quantize_x_kernel's arithmetic
      const size_t blk = (size_t(s) * nq + h) * size_t(hd / kMergeCh) + blockIdx.z;
      qx::quantize_block<1>(v, 0xffffffffu, cl, out_codes + blk * kMergeCh, out_scales + blk);
    }
  }
}

template <int HD>
void launch_split(const AttnShape& sh, const SplitWork* work, int n_work, const float* q,
                  Partials p, float scale_log2, cudaStream_t st) {
  constexpr int W = SplitLaunch<HD>::W, ST = SplitLaunch<HD>::ST;
  constexpr size_t smem = split_smem_bytes<HD, W, ST>();
  // Over the 48 KiB default: the limit is raised per device (and per
  // instantiation), the first time this device launches it.
  static OncePerDevice smem_limit_set;
  smem_limit_set([] {
    check_cuda(cudaFuncSetAttribute(split_attention_kernel<HD, W, ST>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(smem)),
               "cudaFuncSetAttribute(split_attention_kernel)");
  });
  dim3 grid(n_work, sh.n_kv_heads);
  pdl::launch("split_attention_kernel launch", split_attention_kernel<HD, W, ST>, grid, W * 32, smem, st,
              work, q, p.o, p.lse, p.max_splits, sh.n_kv_heads, sh.group, sh.page_size, scale_log2, sh.kv_head0,
              sh.page_heads());
}

}  // namespace

void launch_split_attention(const AttnShape& shape, const SplitWork* work, int n_work,
                            const float* q, Partials partials, cudaStream_t stream) {
  shape.validate();
  if (n_work < 0) throw InvalidArgument("launch_split_attention: n_work is " + std::to_string(n_work));
  if (n_work == 0) return;
  const float scale = shape.softmax_scale > 0.f ? shape.softmax_scale
                                                : 1.f / std::sqrt(float(shape.head_dim));
  const float sl2 = scale * kLog2e;
  if (shape.head_dim == 256) launch_split<256>(shape, work, n_work, q, partials, sl2, stream);
  else if (shape.head_dim == 128) launch_split<128>(shape, work, n_work, q, partials, sl2, stream);
  else launch_split<64>(shape, work, n_work, q, partials, sl2, stream);
  check_cuda(cudaGetLastError(), "split_attention_kernel launch");
}

void launch_merge(const AttnShape& shape, Partials partials, const int32_t* n_splits, int n_seq,
                  float* out, float* out_lse, cudaStream_t stream, Int8Blocks out_int8) {
  shape.validate();
  if (n_seq <= 0) return;
  if (partials.max_splits <= 0 || partials.max_splits > kMaxMergeSplits)
    throw InvalidArgument("launch_merge: max_splits must be 1.." + std::to_string(kMaxMergeSplits) + ", got " +
                          std::to_string(partials.max_splits));
  // kMaxMergeSplits weights are 48 KiB, which with the static arrays passes
  // the default dynamic shared memory limit: raise it once (a 16-token-page
  // history of 12288 splits failed here with "invalid argument").
  static OncePerDevice smem_limit_set;
  smem_limit_set([] {
    check_cuda(cudaFuncSetAttribute(merge_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(size_t(kMaxMergeSplits) * sizeof(float))),
               "cudaFuncSetAttribute(merge_kernel)");
  });
  dim3 grid(n_seq, shape.n_q_heads(), shape.head_dim / kMergeCh);
  pdl::launch("merge_kernel launch", merge_kernel, grid, kMergeThreads, size_t(partials.max_splits) * sizeof(float),
              stream, partials.o, partials.lse, partials.max_splits, n_splits, shape.n_q_heads(), shape.head_dim, out,
              out_lse, out_int8.codes, reinterpret_cast<float2*>(out_int8.scales));
}

}  // namespace activekv::cuda
