// Internal to the CUDA backend: one 32-element unit of a Q4_K super-block in
// a lane's registers, for the register matvec (register_matvec.cu) on Q4_K
// matrices in their GGUF layout.
//
// A Q4_K super-block is 144 bytes (256 elements, 8 units): f16 d, f16 dmin,
// 12 bytes of 6-bit scales and mins, then 128 bytes of nibbles where units
// 2j and 2j + 1 share bytes 16 + 32j .. 16 + 32j + 31 (low and high nibbles).
// 144 = 9 x 16, so in a 16-byte aligned matrix every super-block, its
// 16-byte header and each 32-byte nibble group start 16-byte aligned: a
// unit is three 16-byte loads and no repack is needed (unlike Q4_0's
// 18-byte blocks, quant_split.cuh).
//
// UnitRegs answers the traits' reads (quant_blocks.cuh's Q4_K::raw4, scale,
// min) with the GGUF offsets of *its own unit*: a nibble read at 16 + 32j +
// 4g returns word g of the group the unit was loaded with (the traits only
// ask for their unit's group), and the scale bytes, whose offset depends on
// the unit at run time, are picked by selects rather than a runtime index
// into the register array (which would put it in local memory). So every
// value the traits compute is the one a pointer into the block gives, and
// dot_unit_x on UnitRegs is bitwise dot_unit_x on the block's bytes
// (tests/cuda/test_weights_host.cpp holds it on the CPU) -- but for NaN
// scales, whose payload the device's f16 conversion may change, as the
// split layout's registers (quant_split.cuh) may.
#pragma once

#include <cstdint>

#include "quant_blocks.cuh"

namespace activekv::cuda::qkregs {

using qblk::Q4_K;

inline constexpr int kHeadBytes = 16;   // d, dmin, scales[12]
inline constexpr int kGroupBytes = 32;  // the nibbles of a unit pair

struct UnitRegs {
  uint32_t head[4];  // bytes 0..15 of the super-block, little endian
  uint32_t qs[8];    // bytes 16 + 32 * (u / 2) .. + 31 for the loaded unit u
};

/// Byte offset of unit u's nibble group within its super-block.
AKV_QHD int group_offset(int u) { return kHeadBytes + kGroupBytes * (u >> 1); }

/// head[i] for a run-time i in 0..3, by selects.
AKV_QHD uint32_t head_word(const UnitRegs& s, int i) {
  return i == 0 ? s.head[0] : i == 1 ? s.head[1] : i == 2 ? s.head[2] : s.head[3];
}

#ifdef __CUDACC__
/// A unit of the super-block at `blk` whose nibble group is at `group` (blk
/// + group_offset(u); both 16-byte aligned): its header and its group, three
/// 16-byte streaming loads (qsplit::ld_stream16's ld.global.nc.L1::no_allocate:
/// read once, kept out of L1). The register matvec keeps both pointers, so
/// that a lane's later units (whole super-blocks on) are constant offsets.
__device__ __forceinline__ void load_unit_at(const uint8_t* blk, const uint8_t* group, UnitRegs& r) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.head[0]), "=r"(r.head[1]), "=r"(r.head[2]), "=r"(r.head[3])
               : "l"(blk));
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(group + 16 * i));
    r.qs[4 * i] = v.x, r.qs[4 * i + 1] = v.y, r.qs[4 * i + 2] = v.z, r.qs[4 * i + 3] = v.w;
  }
}
#endif

/// The same on the host (the CPU tests of the source).
inline void load_unit_host(const uint8_t* blk, int u, UnitRegs& r) {
  auto word = [](const uint8_t* p) {
    return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
  };
  for (int i = 0; i < 4; ++i) r.head[i] = word(blk + 4 * i);
  for (int i = 0; i < 8; ++i) r.qs[i] = word(blk + group_offset(u) + 4 * i);
}

// Byte sources over UnitRegs: declared beside it, so that the traits'
// unqualified src_* calls find them by argument-dependent lookup.

/// Q4_K reads 4 bytes only from its nibbles: word g of the loaded group
/// ((off - 16) mod 32 = 4g; g is a constant once dot_unit_x is unrolled).
template <int Align>
AKV_QHD uint32_t src_u32(const UnitRegs& s, int off) {
  return s.qs[((off - kHeadBytes) & (kGroupBytes - 1)) >> 2];
}
/// Q4_K reads single bytes only from its scales (offsets 4..15).
AKV_QHD uint32_t src_u8(const UnitRegs& s, int off) {
  return (head_word(s, off >> 2) >> (8 * (off & 3))) & 0xffu;
}
/// d (offset 0) and dmin (offset 2).
AKV_QHD float src_half(const UnitRegs& s, int off) {
  return qblk::reg_half_to_float(uint16_t(s.head[0] >> (8 * (off & 2))));
}

}  // namespace activekv::cuda::qkregs
