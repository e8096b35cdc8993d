// Internal: one work item of the CPU decode kernels (decode_attention.h) --
// one split of one page, one KV head, all `group` query heads of that head.
// Each kernel writes the item's exact partial: o [group][d] normalised, fp32,
// and lse [group] (natural log). n >= 1.
#pragma once

#include <cstddef>
#include <cstdint>

namespace activekv::cpu::detail {

/// bf16 item. k, v: [n][d] rows of the K and V planes (raw bf16 bits).
/// q: [group][d] fp32; q_hi, q_lo: [group][d] its two bf16 terms (q_hi =
/// bf16(q), q_lo = bf16(q - q_hi)), read by the AVX-512 and AMX kernels only.
/// q_tiles: the two terms as pack_query_amx lays them out, 64-byte aligned
/// (shared by every item of the KV head in a call); read by the AMX kernel
/// only, which needs it.
struct Bf16Item {
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  int n = 0;
  const float* q = nullptr;
  const uint16_t* q_hi = nullptr;
  const uint16_t* q_lo = nullptr;
  const uint16_t* q_tiles = nullptr;
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
/// The bf16 item's softmax and P.V from its scores [group][n] (scaled q.k).
void bf16_finish_avx512(const Bf16Item&, int group, int d, float* scores, float* o, float* lse);

// AMX (kernels_amx.cpp): bf16 q.k on the tile unit, then bf16_finish_avx512.
// Call only where cpu_has_amx_kernels() (the OS has granted the tile state)
// and d % 64 == 0, d <= 512, group in 1..8.
void bf16_item_amx(const Bf16Item&, int group, int d, float scale, float* scores, float* o, float* lse);

/// uint16 elements of one KV head's packed query (both terms, d / 32 chunks
/// of 16 x 32), and the packing: `out` 64-byte aligned. The layout is
/// kernels_amx.cpp's (the tile unit's VNNI layout, heads past `group` zero).
inline constexpr size_t amx_query_elems(int d) { return size_t(2) * size_t(d / 32) * 16 * 32; }
void pack_query_amx(const uint16_t* q_hi, const uint16_t* q_lo, int group, int d, uint16_t* out);

// Portable (kernels_portable.cpp), AVX2 code generation where the CPU has it.
Bf16Kernel pick_bf16_portable();
Int8sKernel pick_int8s_portable();
/// An int8s item's scores [group][n] exactly as attention_int8s.cpp computes
/// them: the reference the vector kernels' scores are held to, bit for bit.
void int8s_scores_reference(const Int8sItem&, int group, int d, float* scores);

}  // namespace activekv::cpu::detail
