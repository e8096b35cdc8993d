// Internal to the CUDA backend: one work item of a Q6_K super-block in the
// split layout (quant_split.cuh) in a lane's registers, for the register
// matvec (register_matvec.cu).
//
// A Q6_K super-block (256 elements, 210 bytes) is ql[128] (low 4 bits),
// qh[64] (high 2 bits), scales[16] (int8, one per 16 elements), then the
// f16 d. The matvec's work item (h, j) (quant_dot.cuh: dot_q6k_item_x) is
// elements 8j..8j+7 of the four units 4h + k, which reads
//   ql bytes 64h + 8j .. + 7       (units 4h, 4h + 2: low, high nibbles)
//   ql bytes 64h + 32 + 8j .. + 7  (units 4h + 1, 4h + 3)
//   qh bytes 128 + 32h + 8j .. + 7 (all four: 2 bits each)
//   scales 192 + 8h + 2k + j / 2   (one per unit: 4 of the 8 at 192 + 8h)
//   d at 208.
// In the split layout the first 208 bytes start 16-byte aligned, so the
// item is four aligned 8-byte loads (ql, ql, qh, and the 8 scale bytes of
// half h) and a 2-byte load of d from the head region.
//
// Q6kItemRegs answers the traits' reads (quant_blocks.cuh's Q6_K::raw4 and
// scale) with the GGUF offsets of *its own item*: a 4-byte read at
// 64h + 32(k & 1) + 4g is word g & 1 of ql[k & 1], one at 128 + 32h + 4g word
// g & 1 of qh; a scale byte is byte 2k + j / 2 of the scale words. Which
// word is picked by selects, not by a run-time index into the register
// arrays (which would put them in local memory): h and j are the lane's, known
// only at run time. So dot_q6k_item_x on Q6kItemRegs is bitwise
// dot_q6k_item_x on the block's bytes (tests/cuda/test_weights_host.cpp
// holds it on the CPU) -- but for a NaN d, whose payload the device's f16
// conversion may change, as the other register sources may.
#pragma once

#include <cstdint>

#include "quant_blocks.cuh"
#include "quant_split.cuh"

namespace activekv::cuda::qsplit {

struct Q6kItemRegs {
  uint32_t ql[2][2];  // ql bytes 64h + 32c + 8j .. + 7 for c = 0, 1 (little endian)
  uint32_t qh[2];     // qh bytes 32h + 8j .. + 7
  uint32_t sc[2];     // scales 8h .. 8h + 7
  uint32_t d;         // the f16 d in the low half
};

/// GGUF offsets of item (h, j)'s loads within its super-block.
AKV_QHD constexpr int q6k_ql_offset(int h, int j, int c) { return 64 * h + 32 * c + 8 * j; }
AKV_QHD constexpr int q6k_qh_offset(int h, int j) { return 128 + 32 * h + 8 * j; }
AKV_QHD constexpr int q6k_sc_offset(int h) { return 192 + 8 * h; }

/// Where item (h, j) of a split block is: its four 8-byte loads (the second
/// ql load is 32 bytes past the first) and d. A lane computes this once;
/// its later items are whole super-blocks on, so their loads are constant
/// offsets from it (register_matvec.cu).
struct Q6kItemAt {
  const uint8_t* ql;  // ql bytes 64h + 8j (units 4h, 4h + 2); + 32: units 4h + 1, 4h + 3
  const uint8_t* qh;  // qh bytes 32h + 8j
  const uint8_t* sc;  // scales 8h .. 8h + 7
  const uint8_t* d;   // the f16 d, in the head region
};

AKV_QHD Q6kItemAt q6k_item_at(const SplitPtr<Q6_K>& s, int h, int j) {
  return {s.payload + q6k_ql_offset(h, j, 0), s.payload + q6k_qh_offset(h, j), s.payload + q6k_sc_offset(h), s.head};
}
static_assert(q6k_ql_offset(0, 0, 1) - q6k_ql_offset(0, 0, 0) == 32 &&
              q6k_ql_offset(1, 3, 1) - q6k_ql_offset(1, 3, 0) == 32);

#ifdef __CUDACC__
/// 8 bytes streamed from global memory (read once: kept out of L1, as ld_stream16).
__device__ __forceinline__ void ld_stream8(const uint8_t* p, uint32_t* w) {
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p));
}

/// The item at a into registers.
__device__ __forceinline__ void load_q6k_item(const Q6kItemAt& a, Q6kItemRegs& r) {
  ld_stream8(a.ql, r.ql[0]);
  ld_stream8(a.ql + 32, r.ql[1]);
  ld_stream8(a.qh, r.qh);
  ld_stream8(a.sc, r.sc);
  r.d = __ldg(reinterpret_cast<const uint16_t*>(a.d));
}
#endif

/// Item (h, j) of split block s on the host (the CPU tests of the source
/// and of q6k_item_at).
inline void load_q6k_item_host(const SplitPtr<Q6_K>& s, int h, int j, Q6kItemRegs& r) {
  auto word = [](const uint8_t* p) {
    return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
  };
  auto two = [&](const uint8_t* p, uint32_t* w) { w[0] = word(p), w[1] = word(p + 4); };
  const Q6kItemAt a = q6k_item_at(s, h, j);
  two(a.ql, r.ql[0]);
  two(a.ql + 32, r.ql[1]);
  two(a.qh, r.qh);
  two(a.sc, r.sc);
  r.d = uint32_t(a.d[0]) | uint32_t(a.d[1]) << 8;
}

// Byte sources over Q6kItemRegs: declared beside it, so that the traits'
// unqualified src_* calls find them by argument-dependent lookup.

/// Q6_K reads 4 bytes only from ql (offsets < 128) and qh (128..191), at
/// 4-byte steps within the item's 8 bytes: bit 2 of the offset picks the
/// word, bit 5 the ql half (units 4h + 1, 4h + 3 start 32 bytes on).
template <int Align>
AKV_QHD uint32_t src_u32(const Q6kItemRegs& s, int off) {
  const bool second = (off >> 2) & 1;
  if (off >= 128) return second ? s.qh[1] : s.qh[0];
  const bool upper = (off >> 5) & 1;
  return upper ? (second ? s.ql[1][1] : s.ql[1][0]) : (second ? s.ql[0][1] : s.ql[0][0]);
}
/// Q6_K reads single bytes only from its scales (192 + 8h + i, i < 8).
AKV_QHD uint32_t src_u8(const Q6kItemRegs& s, int off) {
  const int i = (off - 192) & 7;
  return ((i >> 2 ? s.sc[1] : s.sc[0]) >> (8 * (i & 3))) & 0xffu;
}
/// d (offset 208).
AKV_QHD float src_half(const Q6kItemRegs& s, int /*off*/) { return qblk::reg_half_to_float(uint16_t(s.d)); }

}  // namespace activekv::cuda::qsplit
