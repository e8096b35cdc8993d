// CPU decode attention over history pages in place (issue 12, part 1): the
// host's share of a decode step, returned as the same (O, LSE) partial the GPU
// engine's splits produce (activekv/cuda/decode_attention.h), so the two merge
// with the arithmetic of SPEC §4 (attention::merge_states, launch_merge).
//
// One call = one query step (batch 1, decode: every key of the given pages is
// visible) of one layer over a list of pages in token order. Each page is read
// where it lies (pinned pool slot or published int8s blob); nothing is copied.
//
// Page kinds (SPEC §3):
//   bf16   the page in the PageStore layout (activekv/kv/page_store.h):
//          K planes [n_kv_heads][page_size][head_dim], then V planes, bf16.
//   int8s  a validated view (kv::Int8sPageView, parsed once when the page was
//          published); the kernel validates nothing more. SPEC §3.3 arithmetic
//          with the query in `int8s_query_terms` int8 terms (int8s_query.h):
//          integer q.k on the codes, score = (dot * s_t) * (a * softmax_scale),
//          P.V on the raw value codes, the page's value scale applied once.
//
// Work: each page is cut at fixed page-local boundaries into splits of
// `split_tokens` tokens; one work item = one split x one KV head, computing
// all `group` query heads of that KV head (each K and V row is read once for
// the group). Per item: scores of the split (pass over K), softmax against the
// split's max, P.V (pass over V); the item's partial is exact attention over
// its tokens. Items run on `threads` OpenMP threads in any order; the partials
// are then merged per query head in token order (attention::merge_states).
// Results therefore do not depend on the thread count (bitwise).
//
// Kernels (chosen at run time, Isa::automatic): AVX-512 BF16 + VNNI when the
// CPU has them and head_dim is a multiple of 64 -- bf16 q.k by
// _mm512_dpbf16_ps with the fp32 query split in two bf16 terms (hi + the
// rounding residual, ~2^-16 relative), int8s q.k by _mm512_dpbusd_epi32 --
// else a portable C++ kernel (fp32 q.k over the exactly widened keys; AVX2
// codegen where the CPU has it). Where the CPU also has AMX (tiles, BF16)
// and the OS grants the tile state, bf16 q.k runs on the tile unit instead
// (the key rows as they lie in the page are the A operand, the same two
// query terms the B operand; src/cpu/kernels_amx.cpp; int8s stays AVX-512). All softmax and P.V
// arithmetic in fp32. The ISAs do not give the same bits; each is repeatable.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "activekv/attention/partial.h"
#include "activekv/core/bf16.h"
#include "activekv/kv/codec_int8s.h"

namespace activekv::cpu {

/// Which kernels run.
enum class Isa {
  automatic,  ///< AMX where usable, else AVX-512 (BF16, VNNI) when the CPU has it and the shape allows, else portable
  avx512,     ///< AVX-512; InvalidArgument if the CPU or the shape does not allow it
  portable,   ///< the portable C++ kernels (the fallback; also for comparisons)
  amx,        ///< AVX-512 with q.k and P.V on AMX tiles; InvalidArgument if the CPU, the OS or the shape does not allow it
};

/// "avx512" / "portable" / "amx" / "automatic".
const char* isa_name(Isa isa);
/// True if this CPU has AVX-512F/BW/VL, AVX512_BF16 and AVX512_VNNI.
bool cpu_has_avx512_kernels();
/// True if cpu_has_avx512_kernels() and the CPU has AMX-TILE, AMX-BF16 and
/// AMX-INT8 and Linux granted this process the tile state (arch_prctl
/// ARCH_REQ_XCOMP_PERM, asked once, on the first call). Asking has a
/// process-wide effect: Linux then wants larger signal stacks (a later
/// sigaltstack of the old minimum size fails); where one too small is
/// already set the request fails and the AVX-512 kernels run.
bool cpu_has_amx_kernels();

/// Shape of one layer's attention (the engine's AttnShape, CPU side).
struct DecodeShape {
  int n_kv_heads = 0;
  int group = 0;           ///< query heads per KV head; n_q_heads = n_kv_heads * group
  int head_dim = 0;        ///< any positive value; the AVX-512 kernels need a multiple of 64
  int page_size = 1024;    ///< tokens per page (bf16 plane length; int8s headers must agree)
  float softmax_scale = 0.0f;  ///< multiplies q.k; 0 means 1/sqrt(head_dim)

  int n_q_heads() const { return n_kv_heads * group; }
  /// Throws InvalidArgument naming the field if a field is not positive.
  void validate() const;
};

/// The kernels `isa` runs for `shape` on this CPU: "amx (bf16 q.k), avx512",
/// "avx512" or "portable" (for reports). Throws as attend_pages does where a
/// forced ISA cannot run.
const char* kernels_name(const DecodeShape& shape, Isa isa);

/// One page of the list: exactly one of bf16_page / int8s set, and how many
/// of its tokens (from its first) to attend.
struct PageRef {
  const bf16* bf16_page = nullptr;          ///< bf16 page, PageStore layout (see file comment)
  const kv::Int8sPageView* int8s = nullptr;  ///< validated int8s page; must outlive the call
  int n_tokens = 0;                          ///< tokens [0, n_tokens) of the page, 0..page_size

  static PageRef from_bf16(const bf16* page, int n_tokens) { return {page, nullptr, n_tokens}; }
  static PageRef from_int8s(const kv::Int8sPageView& view, int n_tokens) { return {nullptr, &view, n_tokens}; }
};

struct CpuAttentionOptions {
  int threads = 0;            ///< OpenMP threads; 0 = omp_get_max_threads()
  int split_tokens = 256;     ///< tokens per work item (page-local boundaries)
  int int8s_query_terms = 2;  ///< 1 or 2 (AttentionOptions::int8s_query_terms)
  Isa isa = Isa::automatic;
};

/// Scratch reused across calls (a warm decode step allocates nothing): split
/// partials and per-thread buffers. Not shared by concurrent calls.
struct CpuAttentionWorkspace {
  std::vector<float> split_o, split_lse;  ///< [n_splits][n_q_heads][head_dim], [n_splits][n_q_heads]
  std::vector<std::vector<float>> thread_f32;  ///< per thread: scores and token scales of an item
  std::vector<uint16_t> q_bf16;                ///< [2][n_q_heads][head_dim] the bf16 query terms
  std::vector<uint16_t> q_amx;                 ///< AMX: per KV head, both terms as the tile unit reads them
  std::vector<std::vector<uint16_t>> thread_amx;  ///< AMX: per thread, an item's P terms and V rows as the tile unit reads them
  std::vector<int> query_slot;                 ///< per page: its int8s query slot, -1 for none
  std::vector<int8_t> query_i8;                ///< per (int8s page, KV head): [2][group][head_dim] query codes
  std::vector<float> query_f32;                ///< per (int8s page, KV head): [group] row scales, [head_dim] value scales
  struct MergeScratch {
    std::vector<const float*> o;  ///< a range's O rows of one head
    std::vector<float> lse, out;  ///< their LSE; the merged row before it is written back
  };
  std::vector<MergeScratch> thread_merge;      ///< merge_split_ranges: per thread
};

/// Attention of one query step over `pages` (token order) of one layer.
/// q: [n_q_heads][head_dim] fp32 (RoPE applied). Writes o [n_q_heads][head_dim]
/// (normalised) and lse [n_q_heads] (natural log); with no token at all every
/// head is empty: O = 0, LSE = -inf. Throws InvalidArgument for a bad shape or
/// options, a page with neither or both pointers, n_tokens outside
/// [0, page_size], an int8s page whose dimensions differ from the shape or
/// that holds fewer tokens than asked, or Isa::avx512 / Isa::amx where it cannot run.
void attend_pages(const DecodeShape& shape, std::span<const PageRef> pages, const float* q,
                  const CpuAttentionOptions& opt, CpuAttentionWorkspace& ws, float* o, float* lse);

/// Splits of `pages` at `split_tokens` (page-local boundaries; an empty page
/// has none): the rows attend_pages_splits writes. InvalidArgument if
/// split_tokens is not positive.
size_t count_splits(std::span<const PageRef> pages, int split_tokens);

/// The same attention left unmerged: one (O, LSE) partial per split, in token
/// order, written to split_o [n_splits][n_q_heads][head_dim] (normalised) and
/// split_lse [n_splits][n_q_heads] -- the layout of the GPU engine's partials
/// for consecutive splits of one sequence, so a caller can place them among
/// the GPU's and merge all of them in token order (co-attention, issue 12).
/// Returns n_splits (count_splits). Same checks and errors as attend_pages.
size_t attend_pages_splits(const DecodeShape& shape, std::span<const PageRef> pages, const float* q,
                           const CpuAttentionOptions& opt, CpuAttentionWorkspace& ws, float* split_o,
                           float* split_lse);

/// Consecutive split partials of one sequence: rows [first, first + count)
/// of attend_pages_splits' output.
struct SplitRange {
  size_t first = 0;
  size_t count = 0;
};

/// Merges each range's partials into the range's first row, in place, in
/// token order (SPEC §4: attention::merge_states per query head; a range of
/// one row is left as it is). split_o [rows][n_q_heads][head_dim], split_lse
/// [rows][n_q_heads] as attend_pages_splits writes them; rows past `first`
/// keep their old values. One (range, head) per task, each merged serially:
/// the bits do not depend on `threads` (0 = omp_get_max_threads()). Why:
/// the engine's CPU share sends one row per range across the bus instead of
/// one per split (cuda/cpu_share.h). Throws InvalidArgument for a bad shape.
void merge_split_ranges(const DecodeShape& shape, std::span<const SplitRange> ranges, float* split_o,
                        float* split_lse, int threads, CpuAttentionWorkspace& ws);

/// Same, returning a one-row Partial (O [1][n_q_heads][head_dim], LSE [1][n_q_heads]).
attention::Partial attend_pages(const DecodeShape& shape, std::span<const PageRef> pages, const float* q,
                                const CpuAttentionOptions& opt = {});

/// Bytes of history the call reads for `pages` (K and V codes/values and the
/// per-token scales; per-page metadata excluded): what GB/s figures divide.
size_t history_bytes(const DecodeShape& shape, std::span<const PageRef> pages);

}  // namespace activekv::cpu
