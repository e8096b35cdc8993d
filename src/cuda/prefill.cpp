// Chunked prefill attention: launch planning and workspace. See
// include/activekv/cuda/prefill.h; the kernel is in prefill_attention.cu.
#include "activekv/cuda/prefill.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "device_buffer.h"
#include "prefill_kernel.h"

namespace activekv::cuda {

using prefill_detail::kKeyBlock;

namespace {

// Smallest key range worth a CTA of its own when splitting (16 blocks): below
// it the merge and the per-CTA prologue (query fragments) cost more than the
// parallelism gains.
constexpr int64_t kMinSplitKeys = 512;
// A CTA's fixed cost (query fragments, pipeline fill), in keys, for the split choice.
constexpr int64_t kCtaOverheadKeys = 64;
// Splits the automatic policy considers at most.
constexpr int64_t kMaxAutoSplits = 1024;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

PrefillAttention::PrefillAttention(const AttnShape& shape, const PrefillConfig& cfg) : sh_(shape), cfg_(cfg) {
  sh_.validate();
  if (cfg_.terms < 1 || cfg_.terms > 3)
    throw InvalidArgument("PrefillAttention: terms must be 1..3, got " + std::to_string(cfg_.terms));
  if (cfg_.split_keys < 0 || cfg_.split_keys % kKeyBlock != 0)
    throw InvalidArgument("PrefillAttention: split_keys must be 0 (automatic) or a positive multiple of " +
                          std::to_string(kKeyBlock) + ", got " + std::to_string(cfg_.split_keys));
  const float scale = sh_.softmax_scale > 0.f ? sh_.softmax_scale : 1.f / std::sqrt(float(sh_.head_dim));
  scale_log2_ = scale * 1.4426950408889634f;  // the kernel's scores are in base 2
  const int per_sm = prefill_detail::configure_kernel(sh_.head_dim, cfg_.terms);
  int dev = 0, sms = 0;
  check_cuda(cudaGetDevice(&dev), "PrefillAttention: cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev),
             "PrefillAttention: cudaDeviceGetAttribute(multiProcessorCount)");
  if (per_sm < 1 || sms < 1)
    throw CudaError("PrefillAttention: the kernel (head_dim " + std::to_string(sh_.head_dim) + ", " +
                    std::to_string(prefill_detail::smem_bytes(sh_.head_dim, cfg_.terms)) +
                    " bytes of shared memory) does not fit on this GPU");
  wave_ctas_ = per_sm * sms;
  // The automatic policy never splits beyond this workspace (plan() bounds the
  // splits by it): 4 waves' worth of row tiles' rows -- a short chunk may then
  // split into ~4x the pieces that one wave needs, which evens out the last wave.
  const int bm = prefill_detail::block_rows(sh_.head_dim, cfg_.terms, sh_.group);
  cap_row_splits_ = cfg_.max_row_splits > 0 ? cfg_.max_row_splits
                                            : size_t(4) * bm * size_t(ceil_div(wave_ctas_, sh_.n_kv_heads));
  const size_t nq = size_t(sh_.n_q_heads());
  part_o_ = device_alloc<float>(cap_row_splits_ * nq * sh_.head_dim, "split partial outputs");
  try {
    part_lse_ = device_alloc<float>(cap_row_splits_ * nq, "split partial LSE");
    row_splits_ = device_alloc<int32_t>(cap_row_splits_, "split counts");
  } catch (...) {
    cudaFree(part_o_);
    cudaFree(part_lse_);
    throw;
  }
  ws_bytes_ = cap_row_splits_ * (nq * sh_.head_dim * sizeof(float) + nq * sizeof(float) + sizeof(int32_t));
}

PrefillAttention::~PrefillAttention() {
  cudaFree(part_o_);
  cudaFree(part_lse_);
  cudaFree(row_splits_);
}

PrefillLaunch PrefillAttention::plan(int64_t pos0, int n_rows, int window) const {
  if (pos0 < 0 || n_rows <= 0 || window < 0)
    throw InvalidArgument("PrefillAttention: need pos0 >= 0, n_rows > 0 and window >= 0, got pos0 " +
                          std::to_string(pos0) + ", n_rows " + std::to_string(n_rows) + ", window " +
                          std::to_string(window));
  const int64_t kv = pos0 + n_rows;  // keys of the last row
  if (kv >= int64_t(std::numeric_limits<int32_t>::max()))
    throw InvalidArgument("PrefillAttention: pos0 + n_rows = " + std::to_string(kv) + " must be below 2^31");
  return plan_keys(kv, n_rows, window == 0);
}

// The geometry for n_rows rows whose longest key range is kv keys.
PrefillLaunch PrefillAttention::plan_keys(int64_t kv, int n_rows, bool may_split) const {
  PrefillLaunch L;
  L.block_rows = prefill_detail::block_rows(sh_.head_dim, cfg_.terms, sh_.group);
  L.row_tiles = int(ceil_div(n_rows, L.block_rows));
  int64_t n = 1, keys = 0;
  if (cfg_.split_keys > 0) {
    keys = cfg_.split_keys;
    n = ceil_div(kv, keys);
  } else if (may_split) {
    // Choose the split count that minimises the longest CTA queue: with n
    // splits, ceil(base * n / wave) waves of CTAs of ~kv / n keys each (plus a
    // fixed cost per CTA). Ties keep fewer splits. Bounded by the workspace,
    // kMinSplitKeys per split and kMaxAutoSplits.
    const int64_t base = int64_t(L.row_tiles) * sh_.n_kv_heads;
    const int64_t n_hi = std::min({kv / kMinSplitKeys, int64_t(cap_row_splits_ / size_t(n_rows)), kMaxAutoSplits});
    auto cost = [&](int64_t c) {
      const int64_t k = ceil_div(ceil_div(kv, c), kKeyBlock) * kKeyBlock;
      return ceil_div(base * c, wave_ctas_) * (k + kCtaOverheadKeys);
    };
    int64_t best = cost(1);
    for (int64_t c = 2; c <= n_hi; ++c)
      if (const int64_t t = cost(c); t < best) {
        best = t;
        n = c;
      }
    if (n >= 2) {
      keys = ceil_div(ceil_div(kv, n), kKeyBlock) * kKeyBlock;
      n = ceil_div(kv, keys);
    }
  }
  if (n > kMaxMergeSplits)
    throw InvalidArgument("PrefillAttention: " + std::to_string(n) + " key splits of " + std::to_string(keys) +
                          " exceed the merge's " + std::to_string(kMaxMergeSplits) + "; raise split_keys");
  if (n >= 2) {
    L.n_splits = int(n);
    L.split_keys = int(keys);
  }
  return L;
}

void PrefillAttention::run(const void* const* pages, int64_t n_pages, int64_t pos0, int n_rows, const float* q,
                           float* out, float* out_lse, cudaStream_t stream, int window) {
  check_pointers(pages, q, out);
  const PrefillLaunch L = plan(pos0, n_rows, window);
  check_coverage(n_pages, pos0 + n_rows, "pos0 " + std::to_string(pos0) + " + " + std::to_string(n_rows) + " rows");
  launch(L, pages, pos0, n_rows, std::numeric_limits<int32_t>::max(), window, q, out, out_lse, stream);
}

void PrefillAttention::run_keys(const void* const* pages, int64_t n_pages, int64_t n_keys, int n_rows,
                                const float* q, float* out, float* out_lse, cudaStream_t stream) {
  check_pointers(pages, q, out);
  if (n_keys <= 0 || n_rows <= 0 || n_keys + n_rows >= int64_t(std::numeric_limits<int32_t>::max()))
    throw InvalidArgument("PrefillAttention::run_keys: need n_keys > 0, n_rows > 0 and n_keys + n_rows < 2^31, got " +
                          std::to_string(n_keys) + " keys, " + std::to_string(n_rows) + " rows");
  const PrefillLaunch L = plan_keys(n_keys, n_rows);
  check_coverage(n_pages, n_keys, std::to_string(n_keys) + " keys");
  // Rows sit at positions n_keys + r: past every key, so none is masked causally.
  launch(L, pages, n_keys, n_rows, int(n_keys), 0, q, out, out_lse, stream);
}

void PrefillAttention::check_pointers(const void* const* pages, const float* q, const float* out) const {
  if (!pages || !q || !out)
    throw InvalidArgument(std::string("PrefillAttention::run: null ") + (!pages ? "page table" : !q ? "q" : "out"));
  if (reinterpret_cast<uintptr_t>(q) % 8 != 0 || reinterpret_cast<uintptr_t>(out) % 8 != 0)
    throw InvalidArgument("PrefillAttention::run: q and out must be 8-byte aligned");
}

void PrefillAttention::check_coverage(int64_t n_pages, int64_t tokens, const std::string& what) const {
  if (n_pages <= 0 || n_pages * sh_.page_size < tokens)
    throw InvalidArgument("PrefillAttention::run: " + std::to_string(n_pages) + " pages of " +
                          std::to_string(sh_.page_size) + " tokens cannot hold " + std::to_string(tokens) +
                          " tokens (" + what + ")");
}

void PrefillAttention::launch(const PrefillLaunch& L, const void* const* pages, int64_t pos0, int n_rows,
                              int key_end, int window, const float* q, float* out, float* out_lse,
                              cudaStream_t stream) {
  if (L.n_splits > 1 && size_t(n_rows) * size_t(L.n_splits) > cap_row_splits_)
    throw InvalidArgument("PrefillAttention::run: " + std::to_string(n_rows) + " rows x " +
                          std::to_string(L.n_splits) + " key splits exceed the workspace of " +
                          std::to_string(cap_row_splits_) + " (PrefillConfig::max_row_splits)");
  prefill_detail::KernelArgs a;
  a.pages = pages;
  a.page_size = sh_.page_size;
  a.n_kv = sh_.n_kv_heads;
  a.head0 = sh_.kv_head0;
  a.page_heads = sh_.page_heads();
  a.group = sh_.group;
  a.pos0 = int(pos0);
  a.n_rows = n_rows;
  a.key_end = key_end;
  a.window = window;
  a.q = q;
  a.scale_log2 = scale_log2_;
  a.out = out;
  a.out_lse = out_lse;
  a.n_splits = L.n_splits;
  a.split_keys = L.split_keys;
  a.part_o = part_o_;
  a.part_lse = part_lse_;
  a.row_splits = row_splits_;
  prefill_detail::launch_kernel(a, sh_.head_dim, cfg_.terms, stream);
  if (L.n_splits > 1)
    launch_merge(sh_, Partials{part_o_, part_lse_, L.n_splits}, row_splits_, n_rows, out, out_lse, stream);
}

}  // namespace activekv::cuda
