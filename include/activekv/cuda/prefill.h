// Chunked prefill attention on the GPU: a chunk of query rows attends,
// causally, to a paged BF16 history already in GPU memory (the pages hold the
// history before the chunk AND the chunk's own K/V, written before the call).
//
// Row r of the chunk sits at absolute position pos0 + r and attends tokens
// [0, pos0 + r] -- or, with a sliding window W, (pos0 + r - W, pos0 + r]. Query head i uses KV head i / group. Scores are
// (q . k) * softmax_scale (0 = 1/sqrt(head_dim)); outputs are the normalised
// O and the natural-log LSE of each (row, query head), fp32.
//
// Kernel (src/cuda/prefill_attention.cu): flash-attention style. One CTA =
// block_rows consecutive query rows x all query heads of one KV head, so each
// K/V block is read once per CTA for the whole GQA group and all its rows;
// keys stream page by page in 32-token blocks (multi-stage cp.async), S = Q K^T
// and O += P V run on the tensor cores (mma.sync m16n8k16 bf16, fp32
// accumulation), softmax online in base 2, the causal mask only on the blocks
// that need it. When rows x KV heads alone would not fill the GPU (short
// chunks over long histories), the keys are also split across CTAs and the
// partials merged with launch_merge (decode_attention.h).
//
// Precision: K/V are exact bf16; the fp32 query and the softmax weights P enter
// the tensor cores as `terms` bf16 terms each (relative representation error
// <= 2^-8 per term: 1 term ~ bf16, 2 ~ 16 bits, 3 ~ fp32). See
// kDefaultPrefillTerms for the choice; tests/cuda/test_prefill.cpp reports the
// measured error for each count.
//
// Page layout: that of decode_attention.h (K planes [n_kv_heads][page_size]
// [head_dim], then V planes, bf16). Head dims 64, 128, 256; group 1..8.
// A head shard's shape (AttnShape::sharded(), tensor parallel) attends KV
// heads [kv_head0, kv_head0 + n_kv_heads) of pages of page_heads() heads;
// its q, out and LSE hold those heads only, as the decode kernels' do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "activekv/cuda/decode_attention.h"

namespace activekv::cuda {

/// Default bf16 terms for the query and P. Two terms carry ~16 significant
/// bits (error <= 2^-16 relative per value, against the 2^-8 of the bf16 K/V
/// themselves): score errors ~1e-5 of |q||k| scale, 250x below what the bf16
/// storage of K already costs. Measured on the H200 (test_prefill.cpp, 10
/// shapes; bench_prefill_attention, 27B shape, 2048 rows at depth 128K):
///   terms  worst max rel O error  ms per chunk and layer
///   1      1.3e-2                 31.3
///   2      2.2e-5                 40.9
///   3      7.0e-6 (fp32 level)    73.7
/// Two terms: within 3x of fp32 accuracy for 1.8x less time than three.
inline constexpr int kDefaultPrefillTerms = 2;

struct PrefillConfig {
  /// bf16 terms of the query and of P, 1..3.
  int terms = kDefaultPrefillTerms;
  /// Keys per CTA along the history: 0 = automatic (the split count, from 1,
  /// that minimises the longest queue of CTAs on the GPU's SMs -- a short chunk
  /// over a long history splits, a chunk that fills the GPU does not -- with
  /// >= 512 keys per split and within the workspace); > 0 forces splits of
  /// that many keys (a multiple of 32) for every run -- for tests and
  /// measurements; then the workspace (max_row_splits) must hold n_rows x splits.
  int split_keys = 0;
  /// Rows x splits the partial workspace holds (allocated once in the
  /// constructor). 0 = 4 x block_rows x ceil(wave / n_kv_heads) (wave = SMs x
  /// CTAs per SM): 68 MB for the 27B shape on an H200 with 2 terms.
  size_t max_row_splits = 0;
};

/// How one run is cut into CTAs (host-side arithmetic; for tests and benchmarks).
struct PrefillLaunch {
  int block_rows = 0;  ///< query rows per CTA
  int row_tiles = 0;   ///< ceil(n_rows / block_rows)
  int n_splits = 1;    ///< CTAs along the keys per (row tile, KV head); > 1: partials + merge
  int split_keys = 0;  ///< keys per split when n_splits > 1 (a multiple of 32), else 0
  int ctas() const { return row_tiles * n_splits; }  ///< per KV head
};

/// Chunked causal prefill attention for one attention shape (split_tokens of
/// the AttnShape is not used). Owns a device workspace for split partials,
/// sized once in the constructor: run() allocates nothing and never waits for
/// the host. Bound to the GPU current at construction. Not thread-safe (one
/// workspace): give each concurrent stream its own instance.
class PrefillAttention {
 public:
  /// Throws InvalidArgument for an unsupported shape or config, CudaError if
  /// the GPU cannot be used or the workspace cannot be allocated.
  explicit PrefillAttention(const AttnShape& shape, const PrefillConfig& cfg = {});
  ~PrefillAttention();
  PrefillAttention(const PrefillAttention&) = delete;
  PrefillAttention& operator=(const PrefillAttention&) = delete;

  /// The launch geometry run(pos0, n_rows, ..., window) uses. Throws as run does for bad pos0 / n_rows.
  PrefillLaunch plan(int64_t pos0, int n_rows, int window = 0) const;

  /// Enqueues the attention of rows [0, n_rows) at positions pos0 + r on `stream`.
  ///   pages:   DEVICE array of n_pages device page pointers, in token order
  ///            (page i holds tokens [i * page_size, (i + 1) * page_size));
  ///            n_pages * page_size must cover pos0 + n_rows tokens. Pages may
  ///            lie anywhere; slots past token pos0 + n_rows are never read.
  ///   q:       device fp32 [n_rows][n_q_heads][head_dim] (RoPE applied), 8-byte aligned
  ///   out:     device fp32 [n_rows][n_q_heads][head_dim], 8-byte aligned
  ///   out_lse: device fp32 [n_rows][n_q_heads] (natural log), or null
  ///   window:  0, or a sliding window W > 0: row p attends keys (p - W, p]
  ///            only. Pages (table entries) wholly before pos0 - W - 31 are
  ///            never read, so a table may map page i to a ring of device
  ///            pages (i mod ring) that holds the last W + 32 + n_rows tokens.
  ///            Automatic planning never splits a windowed run's keys (a window
  ///            is short); a forced split_keys still applies.
  /// Asynchronous: the caller keeps pages, q and the table valid until the
  /// stream has passed this call. Throws InvalidArgument (bad pointer, pos0 <
  /// 0, n_rows <= 0, window < 0, history not covered, pos0 + n_rows >= 2^31, a
  /// forced split that does not fit the workspace) before enqueueing anything;
  /// CudaError if a launch fails.
  void run(const void* const* pages, int64_t n_pages, int64_t pos0, int n_rows, const float* q, float* out,
           float* out_lse, cudaStream_t stream, int window = 0);

  /// Enqueues the attention of rows [0, n_rows) to every key of [0, n_keys),
  /// with no causal mask: a segment of history that lies wholly before the
  /// rows (a prefill whose history streams through a staging area attends it
  /// segment by segment and merges the (O, LSE) partials with launch_merge).
  /// pages: as run(), covering n_keys tokens; no slot at or past n_keys is
  /// read. q, out, out_lse: as run() (out_lse is what a merge needs). Keys
  /// split across CTAs as run() splits a last row's n_keys keys. Throws InvalidArgument (bad pointer, n_keys <= 0, n_rows <=
  /// 0, n_keys + n_rows >= 2^31, pages not covering n_keys); CudaError if a
  /// launch fails.
  void run_keys(const void* const* pages, int64_t n_pages, int64_t n_keys, int n_rows, const float* q, float* out,
                float* out_lse, cudaStream_t stream);

  const AttnShape& shape() const { return sh_; }
  const PrefillConfig& config() const { return cfg_; }
  /// Bytes of device workspace owned (split partials and their counts).
  size_t workspace_bytes() const { return ws_bytes_; }

 private:
  PrefillLaunch plan_keys(int64_t kv, int n_rows, bool may_split = true) const;
  void check_pointers(const void* const* pages, const float* q, const float* out) const;
  void check_coverage(int64_t n_pages, int64_t tokens, const std::string& what) const;
  void launch(const PrefillLaunch& L, const void* const* pages, int64_t pos0, int n_rows, int key_end, int window,
              const float* q, float* out, float* out_lse, cudaStream_t stream);

  AttnShape sh_;
  PrefillConfig cfg_;
  int wave_ctas_ = 0;  // CTAs that fill the GPU once (SMs x CTAs per SM)
  float scale_log2_ = 0.f;  // softmax_scale * log2(e)
  float* part_o_ = nullptr;
  float* part_lse_ = nullptr;
  int32_t* row_splits_ = nullptr;
  size_t cap_row_splits_ = 0;
  size_t ws_bytes_ = 0;
};

}  // namespace activekv::cuda
