// Internal: one work item of the CPU decode kernels (decode_attention.h) --
// one split of one page, one KV head, all `group` query heads of that head.
// Each kernel writes the item's exact partial: o [group][d] normalised, fp32,
// and lse [group] (natural log). n >= 1.
#pragma once

#include <cstddef>
#include <cstdint>

namespace activekv::cpu::detail {

/// The first key and value rows of the thread's next item (`bytes` of each
/// from k and v; none when 0): a kernel may prefetch them while it computes
/// from the cache, so that the memory is busy then too.
struct NextRows {
  const char* k = nullptr;
  const char* v = nullptr;
  int bytes = 0;
};

/// bf16 item. k, v: [n][d] rows of the K and V planes (raw bf16 bits).
/// q: [group][d] fp32; q_hi, q_lo: [group][d] its two bf16 terms (q_hi =
/// bf16(q), q_lo = bf16(q - q_hi)), read by the AVX-512 and AMX kernels only.
/// q_tiles: the two terms as pack_query_amx lays them out, 64-byte aligned
/// (shared by every item of the KV head in a call); read by the AMX kernel
/// only, which needs it. pv_tiles: the AMX kernel's P.V scratch,
/// amx_pv_scratch_elems(group, d, n) elements, 64-byte aligned, the
/// thread's own (read and written by the AMX kernel only).
struct Bf16Item {
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  int n = 0;
  const float* q = nullptr;
  const uint16_t* q_hi = nullptr;
  const uint16_t* q_lo = nullptr;
  const uint16_t* q_tiles = nullptr;
  uint16_t* pv_tiles = nullptr;
  NextRows next;  ///< read by the AMX kernel only
};

/// int8s item. kq, vq: [n][d] codes; s: [n] key token scales; vscale: [d]
/// value channel scales (fp32, widened exactly); qq, qq_lo: [group][d] the
/// int8 query terms of this page (qq_lo unread when terms == 1);
/// row_scale: [group] a_h * softmax_scale (int8s_query.h).
struct Int8sItem {
  const int8_t* kq = nullptr;
  const int8_t* vq = nullptr;
  int n = 0;
  const float* s = nullptr;
  const float* vscale = nullptr;
  const int8_t* qq = nullptr;
  const int8_t* qq_lo = nullptr;
  const float* row_scale = nullptr;
  int terms = 2;
  uint16_t* pv_tiles = nullptr;  ///< as Bf16Item's: the AMX kernel's scratch
  NextRows next;                 ///< read by the AMX kernel only
};

/// scores: scratch of group * n floats.
using Bf16Kernel = void (*)(const Bf16Item&, int group, int d, float scale, float* scores, float* o, float* lse);
using Int8sKernel = void (*)(const Int8sItem&, int group, int d, float* scores, float* o, float* lse);

// AVX-512 BF16/VNNI (kernels_avx512.cpp): call only where cpu_has_avx512_kernels()
// and d % 64 == 0, group in 1..8.
void bf16_item_avx512(const Bf16Item&, int group, int d, float scale, float* scores, float* o, float* lse);
void int8s_item_avx512(const Int8sItem&, int group, int d, float* scores, float* o, float* lse);
/// The int8s item's scores alone, [group][n] (what int8s_item_avx512 softmaxes): for the bitwise test.
void int8s_scores_avx512(const Int8sItem&, int group, int d, float* scores);
/// The softmax alone: scores [group][n] (scaled q.k) become p = exp(s - m)
/// in place; inv_l [group] = 1 / sum p, lse [group] = m + log(sum p).
void softmax_rows_avx512(float* scores, int group, int n, float* inv_l, float* lse);

// AMX (kernels_amx.cpp): q.k and P.V on the tile unit, the softmax by
// softmax_rows_avx512. Call only where cpu_has_amx_kernels() (the OS has granted the tile state)
// and d % 64 == 0, d <= 512, group in 1..8.
void bf16_item_amx(const Bf16Item&, int group, int d, float scale, float* scores, float* o, float* lse);
/// int8s on AMX (also AMX-INT8): q.k by tdpbssd, the softmax, P.V by
/// tdpbusd with P in four base-256 digits and the value codes as they are.
/// Same conditions as bf16_item_amx.
void int8s_item_amx(const Int8sItem&, int group, int d, float* scores, float* o, float* lse);
/// Its scores alone, [group][n]: bitwise the reference's (the bitwise test).
void int8s_scores_amx(const Int8sItem&, int group, int d, float* scores);

/// uint16 elements of the AMX P.V scratch of an item of n tokens, either
/// format's: bf16, P as three bf16 terms [3 * group][n32] and V in the tile
/// unit's pair layout [d][n32] (n32 = n rounded up to 32 tokens); int8s, P
/// as four uint8 digits [4 * group][n64] and V in quads [d][n64] bytes (n64:
/// to 64); then four 1 KiB output tiles.
inline constexpr size_t amx_pv_scratch_elems(int group, int d, int n) {
  const size_t n32 = (size_t(n) + 31) / 32 * 32, n64 = (size_t(n) + 63) / 64 * 64;
  const size_t bf16 = (size_t(3) * group + size_t(d)) * n32, int8s = (size_t(4) * group + size_t(d)) * n64 / 2;
  return (bf16 > int8s ? bf16 : int8s) + 4 * 16 * 16 * 2;
}

/// uint16 elements of one KV head's packed query (d / 32 chunks of 16 x 32:
/// both terms, head h's hi as column h and its lo as column group + h of
/// each chunk's tile), and the packing: `out` 64-byte aligned. The layout is
/// kernels_amx.cpp's (the tile unit's VNNI layout, columns past 2 * group zero).
inline constexpr size_t amx_query_elems(int d) { return size_t(d / 32) * 16 * 32; }
void pack_query_amx(const uint16_t* q_hi, const uint16_t* q_lo, int group, int d, uint16_t* out);

// Portable (kernels_portable.cpp), AVX2 code generation where the CPU has it.
Bf16Kernel pick_bf16_portable();
Int8sKernel pick_int8s_portable();
/// An int8s item's scores [group][n] exactly as attention_int8s.cpp computes
/// them: the reference the vector kernels' scores are held to, bit for bit.
void int8s_scores_reference(const Int8sItem&, int group, int d, float* scores);

}  // namespace activekv::cpu::detail
