// CPU attention of many query rows (a prefill chunk) over bf16 history pages
// in place -- the CPU model's prefill, where the reference path
// (attention::attend_tile: two OpenBLAS sgemms per page over fp32 copies of
// the planes, the whole rows x page score matrix through memory, a scalar
// exp per score) spent most of a long prompt's time.
//
// One call = one layer, any number of query rows, each at its own absolute
// position p: row p sees the keys at positions <= p, and with a sliding window
// W only those > p - W (attention::AttentionOptions::window). Pages are listed
// in token order; page i holds the keys at positions first_token + i *
// page_size + t, t < its n_tokens. Every page is bf16 in the PageStore layout
// (K planes [n_kv_heads][page_size][head_dim], then V planes).
//
// Work: one item = one KV head x a block of consecutive rows (all `group`
// query heads of each row: each key and value row is widened once per item
// for ~48 head rows). An item walks its keys in blocks of 64 at fixed
// page-local boundaries -- skipping blocks none of its rows can see -- and
// keeps per head row an online softmax (max, sum, fp32 accumulator): scores
// of the block (4 keys x 16 head rows register tiles over the widened keys and
// the transposed query), the masked exp, then P.V (4 head rows x 16 channels).
// Nothing of size rows x keys ever leaves the cache.
//
// Arithmetic (the same in every kernel, so AVX2 and portable give the same
// bits): score = (sum_j k_j * q_j, fused multiply-adds in channel order) *
// scale; exp by a Cephes-style polynomial (relative error ~1e-7; arguments
// below -87 give 0); per block m' = max(m, block max), l' = l * e^(m - m') +
// sum of the block's p in token order, the block's p.V summed from zero by
// fused multiply-adds in token order and acc' = fma(acc, e^(m - m'), that
// sum); O = acc * (1 / l), LSE = m + log(l). A row that sees a NaN or +inf
// score gets NaN O and LSE (as attend_tile does). For finite K and V a row's
// bits depend only on its own position, the pages and the block boundaries --
// not on the other rows of the call, the row blocking or the thread count (a
// value row that a row cannot see enters its sum as 0 x v when another row of
// its item sees it, so a non-finite V there poisons it: attend_tile's sgemm
// does the same).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "activekv/cpu/decode_attention.h"

namespace activekv::cpu {

/// Which kernel runs.
enum class PrefillIsa {
  automatic,  ///< AVX2 + FMA where the CPU has them, else portable
  avx2,       ///< InvalidArgument if the CPU lacks AVX2 or FMA
  portable,   ///< plain C++ (std::fma): the same bits as avx2, slowly
};

/// True if this CPU has AVX2 and FMA.
bool cpu_has_avx2_fma_kernels();

/// Whether attend_prefill takes `shape` (head_dim a multiple of 16; the
/// fields positive).
bool prefill_kernels_support(const DecodeShape& shape);

/// Query rows of one call.
struct PrefillRows {
  const float* q = nullptr;            ///< [n_rows][n_q_heads][head_dim] fp32, RoPE applied
  const int64_t* positions = nullptr;  ///< [n_rows] absolute positions, >= 0, any order
  int n_rows = 0;
  int64_t window = 0;  ///< sliding window in tokens; 0 = the whole causal history
};

struct PrefillOptions {
  int threads = 0;  ///< OpenMP threads; 0 = omp_get_max_threads()
  PrefillIsa isa = PrefillIsa::automatic;
};

/// Per-thread scratch reused across calls (a warm call allocates nothing).
/// Not shared by concurrent calls.
struct PrefillWorkspace {
  std::vector<std::vector<float>> thread_f32;
  std::vector<const uint16_t*> planes;  ///< per (KV head, page): K then V plane pointers
  std::vector<int> page_tokens;
};

/// Attention of `rows` over `pages` (token order, bf16) of one layer.
/// Writes o [n_rows][n_q_heads][head_dim] (normalised) and lse
/// [n_rows][n_q_heads] (natural log); a (row, head) that sees no key gets
/// O = 0, LSE = -inf. Throws InvalidArgument for a shape
/// prefill_kernels_support refuses, a page that is not bf16 or whose n_tokens
/// is outside [0, page_size], a negative position or window, a null q or
/// positions with rows, or PrefillIsa::avx2 on a CPU without it.
void attend_prefill(const DecodeShape& shape, std::span<const PageRef> pages, int64_t first_token,
                    const PrefillRows& rows, const PrefillOptions& opt, PrefillWorkspace& ws, float* o, float* lse);

/// The same, returning a Partial (O [n_rows][n_q_heads][head_dim], LSE [n_rows][n_q_heads]).
attention::Partial attend_prefill(const DecodeShape& shape, std::span<const PageRef> pages, int64_t first_token,
                                  const PrefillRows& rows, const PrefillOptions& opt = {});

}  // namespace activekv::cpu
