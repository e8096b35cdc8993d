// Internal: one work item of the CPU prefill attention (prefill_attention.h)
// -- one KV head, a block of query rows -- its inputs, scratch layout and the
// two kernels (prefill_kernel.h has their one template).
#pragma once

#include <cstddef>
#include <cstdint>

namespace activekv::cpu::detail {

inline constexpr int kPrefillKeyBlock = 64;  ///< keys per block, at page-local boundaries
inline constexpr int kPrefillTile = 16;      ///< head rows (score tile) and channels (P.V tile): two vectors

/// One item. Head row i = r * group + h is query head h of this KV head for
/// row r. The kernel leaves the online-softmax state in the scratch
/// (prefill_state): the caller normalises.
struct PrefillItem {
  const uint16_t* const* k = nullptr;  ///< [n_pages] this KV head's K plane of page i, [page_size][d] bf16 bits
  const uint16_t* const* v = nullptr;  ///< [n_pages] its V plane
  const int* page_tokens = nullptr;    ///< [n_pages] keys present in page i
  int n_pages = 0;
  int page_size = 0;
  int64_t first_token = 0;  ///< position of page 0's key 0
  int group = 0;
  int d = 0;  ///< multiple of kPrefillTile
  float scale = 0.0f;
  int64_t window = 0;
  int n_rows = 0;
  const int64_t* positions = nullptr;  ///< [n_rows]
  const float* q = nullptr;            ///< row r, head h: q + r * q_stride + h * d
  size_t q_stride = 0;
  float* scratch = nullptr;  ///< prefill_scratch(n_rows * group, d).total floats
};

inline int prefill_padded_rows(int head_rows) { return (head_rows + kPrefillTile - 1) / kPrefillTile * kPrefillTile; }

/// Where each buffer of an item's scratch starts, in floats from its start:
/// Q^T [d][Mp], K and V blocks [64][d] each, scores [64][Mp], then the state
/// acc [Mp][d], m, l, and per block alpha and the first and last visible key
/// [Mp] each (Mp = prefill_padded_rows); `total` floats in all. The one
/// layout the kernel, the driver's scratch size and prefill_state read.
struct PrefillScratch {
  size_t qt, kf, vf, st, acc, m, l, alpha, lo, hi, total;
};

inline PrefillScratch prefill_scratch(int head_rows, int d) {
  const size_t mp = size_t(prefill_padded_rows(head_rows)), kb = kPrefillKeyBlock, dd = size_t(d);
  PrefillScratch s{};
  s.kf = s.qt + dd * mp;
  s.vf = s.kf + kb * dd;
  s.st = s.vf + kb * dd;
  s.acc = s.st + kb * mp;
  s.m = s.acc + mp * dd;
  s.l = s.m + mp;
  s.alpha = s.l + mp;
  s.lo = s.alpha + mp;
  s.hi = s.lo + mp;
  s.total = s.hi + mp;
  return s;
}

/// The state an item leaves: acc [Mp][d] (unnormalised), m [Mp] (-inf: the
/// head row saw no key), l [Mp].
struct PrefillState {
  const float* acc;
  const float* m;
  const float* l;
};

inline PrefillState prefill_state(const float* scratch, int head_rows, int d) {
  const PrefillScratch s = prefill_scratch(head_rows, d);
  return {scratch + s.acc, scratch + s.m, scratch + s.l};
}

void prefill_item_avx2(const PrefillItem& it);
void prefill_item_portable(const PrefillItem& it);

}  // namespace activekv::cpu::detail
