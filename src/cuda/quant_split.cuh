// Internal to the CUDA backend: the split layout of a weight matrix of a
// 32-element block type or Q6_K (WeightLayout::Split in quant_matvec.h).
//
// A GGUF Q4_0 block is 18 bytes: an f16 scale, then 16 bytes of codes. Rows
// of such blocks put the codes at 2-byte alignment, so a kernel reads them
// with 16-bit loads or stages them through shared memory first; either costs
// more instructions per byte than the decode matvec can afford (the H200
// profile at f19e007: the chunked kernel issued 0.71 warp instructions per
// cycle per scheduler at 52 % of DRAM bandwidth). The split layout keeps the
// same bytes in two regions of the matrix:
//
//   payload [rows][n_blocks][kPayload]   the codes (Q4_0..Q8_0: the block's last kPayload bytes)
//   head    [rows][n_blocks][kHead]      the rest (scale, min, fifth bits)
//
// so that every block's codes are one or two 16-byte loads from a 16-byte
// aligned address (the matrix starts 16-byte aligned and kPayload is 16 or
// 32). Q6_K splits the other way round: its 210-byte super-block is 208
// bytes of codes and scales (ql, qh, scales: 13 x 16 bytes) followed by the
// f16 d, so the payload is the block's *first* 208 bytes and the head its
// last 2 (kPayloadAt, kHeadAt), and every payload starts 16-byte aligned.
// Q4_K's 144-byte super-block is a 16-byte head (d, dmin, 12 bytes of 6-bit
// scales and mins) and 128 bytes of nibbles, where units 2j and 2j + 1 share
// 32 bytes (low and high nibbles). Its split payload also regroups the
// nibbles by unit (kNibblesByUnit): unit u's 32 codes are payload bytes
// 16u .. 16u + 15, element e < 16 the low nibble of byte e and element 16 + e
// the high one -- Q4_0's order. So a lane that takes one unit loads 16
// bytes of codes for its 16 bytes, not the pair's 32 (in the GGUF layout the
// register kernel held 48 bytes of registers per 18-byte unit, and lost to
// the chunked kernel: bench/results/h200_q4k_register_model_b6cb9a6.json).
// The matrix's size is unchanged. Readers see a split block through a
// byte source (quant_blocks.cuh): SplitPtr in memory, SplitRegs (32-element
// types), Q6kItemRegs (Q6_K, quant_q6kregs.cuh) or qkregs::UnitRegs (Q4_K,
// quant_kregs.cuh) in registers; SplitPtr and SplitRegs present the block's
// GGUF byte offsets, so every traits function and every dot product is the
// GGUF layout's, bit for bit; the register sources of the K-quants have
// their own dot, tested bitwise against the GGUF bytes'.
#pragma once

#include <cstdint>
#include <type_traits>

#include "activekv/cuda/quant_matvec.h"
#include "quant_blocks.cuh"

namespace activekv::cuda::qsplit {

using qblk::Q4_0;
using qblk::Q4_1;
using qblk::Q5_0;
using qblk::Q8_0;
using qblk::Q4_K;
using qblk::Q6_K;

/// kOk: the type has a split layout; kHead + kPayload == T::kBytes. The head
/// is GGUF bytes kHeadAt .. kHeadAt + kHead - 1 of the block, the payload
/// bytes kPayloadAt .. kPayloadAt + kPayload - 1: for the 32-element types
/// the head comes first (kHeadAt 0, kPayloadAt kHead), for Q6_K last.
/// kNibblesByUnit: the payload regroups the GGUF nibbles by unit (Q4_K,
/// above; split_payload_byte and gguf_nibble_word map them); otherwise the
/// payload is the GGUF bytes as they are.
template <class T>
struct SplitOf {
  static constexpr bool kOk = false, kNibblesByUnit = false;
  static constexpr int kHead = 0, kPayload = 0, kHeadAt = 0, kPayloadAt = 0;
};
/// The 32-element types: head first, payload (the codes) last.
template <int Head, int Payload, bool NibblesByUnit = false>
struct HeadFirst {
  static constexpr bool kOk = true, kNibblesByUnit = NibblesByUnit;
  static constexpr int kHead = Head, kPayload = Payload, kHeadAt = 0, kPayloadAt = Head;
};
template <>
struct SplitOf<Q4_0> : HeadFirst<2, 16> {};  // f16 d | 16 bytes of nibbles
template <>
struct SplitOf<Q4_1> : HeadFirst<4, 16> {};  // f16 d, f16 m | 16 bytes of nibbles
template <>
struct SplitOf<Q5_0> : HeadFirst<6, 16> {};  // f16 d, 4 bytes of fifth bits | 16 bytes of nibbles
template <>
struct SplitOf<Q8_0> : HeadFirst<2, 32> {};  // f16 d | 32 int8 codes

template <>
struct SplitOf<Q4_K> : HeadFirst<16, 128, true> {};  // d, dmin, scales[12] | 8 units x 16 bytes of nibbles

template <>
struct SplitOf<Q6_K> {  // ql[128] qh[64] scales[16] | f16 d
  static constexpr bool kOk = true, kNibblesByUnit = false;
  static constexpr int kHead = 2, kPayload = 208, kHeadAt = 208, kPayloadAt = 0;
};

/// Byte offsets of block b of row r in a split matrix of `rows` rows of
/// `n_blocks` blocks (host and device; the repack kernel and every reader).
template <class T>
AKV_QHD int64_t payload_offset(int64_t r, int64_t b, int64_t n_blocks) {
  return (r * n_blocks + b) * SplitOf<T>::kPayload;
}
template <class T>
AKV_QHD int64_t head_offset(int64_t rows, int64_t r, int64_t b, int64_t n_blocks) {
  return rows * n_blocks * SplitOf<T>::kPayload + (r * n_blocks + b) * SplitOf<T>::kHead;
}

/// Byte i of a block's split payload, from the block's GGUF bytes g (the
/// repack). For Q4_K, unit u = i / 16's elements b = i % 16 (low nibble)
/// and b + 16 (high), from the GGUF group of units 2j, 2j + 1 (j = u / 2),
/// where element e of unit u is nibble u % 2 of group byte e.
template <class T>
AKV_QHD uint8_t split_payload_byte(const uint8_t* g, int i) {
  if constexpr (SplitOf<T>::kNibblesByUnit) {
    const int u = i >> 4, b = i & 15, shift = 4 * (u & 1);
    const uint8_t* group = g + SplitOf<T>::kPayloadAt + 32 * (u >> 1);
    return uint8_t(((group[b] >> shift) & 15) | (((group[b + 16] >> shift) & 15) << 4));
  } else {
    return g[SplitOf<T>::kPayloadAt + i];
  }
}

/// GGUF word kPayloadAt + i (i = 32j + 4g, g < 8) of a block with
/// kNibblesByUnit from its split payload p, the inverse of
/// split_payload_byte: group byte 4g + k is element 4g + k of units 2j and
/// 2j + 1, which sit in byte 4(g % 4) + k of their 16 payload bytes, low
/// nibble for g < 4.
AKV_QHD uint32_t gguf_nibble_word(const uint8_t* p, int i) {
  const int j = i >> 5, g = (i & 31) >> 2, shift = 4 * (g >> 2);
  const uint32_t lo = (qblk::ld32<4>(p + 32 * j + 4 * (g & 3)) >> shift) & 0x0f0f0f0fu;
  const uint32_t hi = (qblk::ld32<4>(p + 32 * j + 16 + 4 * (g & 3)) >> shift) & 0x0f0f0f0fu;
  return lo | (hi << 4);
}

/// GGUF byte kPayloadAt + i of a block from its split payload p.
template <class T>
AKV_QHD uint8_t gguf_payload_byte(const uint8_t* p, int i) {
  if constexpr (SplitOf<T>::kNibblesByUnit) {
    return uint8_t(gguf_nibble_word(p, i & ~3) >> (8 * (i & 3)));
  } else {
    return p[i];
  }
}

/// A split block in memory. GGUF offsets in the head read it (2-byte
/// aligned), the rest the payload (16-byte aligned, so 4-byte reads there
/// are aligned: every traits' payload read is at kPayloadAt + 4k).
template <class T>
struct SplitPtr {
  const uint8_t* head;
  const uint8_t* payload;
};

template <class T>
AKV_QHD SplitPtr<T> split_block(const uint8_t* w, int64_t rows, int64_t r, int64_t b, int64_t n_blocks) {
  return {w + head_offset<T>(rows, r, b, n_blocks), w + payload_offset<T>(r, b, n_blocks)};
}

/// Block b of row r as a byte source, in either layout: a SplitPtr when
/// kSplit, else the pointer into the GGUF row (row_bytes apart).
template <class T, bool kSplit>
AKV_QHD auto block_at(const uint8_t* w, int64_t rows, int64_t row_bytes, int64_t r, int64_t b, int64_t n_blocks) {
  if constexpr (kSplit) {
    return split_block<T>(w, rows, r, b, n_blocks);
  } else {
    return w + r * row_bytes + b * T::kBytes;
  }
}

/// Calls f(std::bool_constant<kSplit>) for a matrix of type T laid out as
/// `layout` (types without a split layout: always false), so that a kernel
/// launch names its layout once.
template <class T, class F>
void with_layout(WeightLayout layout, F&& f) {
  if constexpr (SplitOf<T>::kOk) {
    if (layout == WeightLayout::Split) return f(std::true_type{});
  }
  f(std::false_type{});
}

/// The GGUF bytes of a split block, for the CPU reference of the repack.
template <class T>
void gguf_block(const SplitPtr<T>& s, uint8_t* out) {
  for (int i = 0; i < SplitOf<T>::kHead; ++i) out[SplitOf<T>::kHeadAt + i] = s.head[i];
  for (int i = 0; i < SplitOf<T>::kPayload; ++i) out[SplitOf<T>::kPayloadAt + i] = gguf_payload_byte<T>(s.payload, i);
}

/// True when GGUF byte `off` of a T block is in its head.
template <class T>
AKV_QHD bool in_head(int off) {
  return off >= SplitOf<T>::kHeadAt && off < SplitOf<T>::kHeadAt + SplitOf<T>::kHead;
}

template <class T>
struct SplitRegs;

}  // namespace activekv::cuda::qsplit

namespace activekv::cuda::qblk {

// Byte sources over split blocks (found by argument-dependent lookup from
// the traits' unqualified src_* calls: declared in qblk beside the others).

template <int Align, class T>
AKV_QHD uint32_t src_u32(const qsplit::SplitPtr<T>& s, int off) {
  using S = qsplit::SplitOf<T>;
  if (qsplit::in_head<T>(off)) return ld32<2>(s.head + (off - S::kHeadAt));
  if constexpr (S::kNibblesByUnit) {
    return qsplit::gguf_nibble_word(s.payload, off - S::kPayloadAt);  // Q4_K reads its nibbles at 16 + 4k only
  } else {
    return ld32<4>(s.payload + (off - S::kPayloadAt));
  }
}
template <class T>
AKV_QHD uint32_t src_u8(const qsplit::SplitPtr<T>& s, int off) {
  using S = qsplit::SplitOf<T>;
  return qsplit::in_head<T>(off) ? s.head[off - S::kHeadAt]
                                 : qsplit::gguf_payload_byte<T>(s.payload, off - S::kPayloadAt);
}
template <class T>
AKV_QHD float src_half(const qsplit::SplitPtr<T>& s, int off) {
  return ld_half(s.head + (off - qsplit::SplitOf<T>::kHeadAt));  // every f16 of these types is in the head
}

}  // namespace activekv::cuda::qblk

namespace activekv::cuda::qsplit {

/// A split block of a 32-element type in registers: the head's bytes in
/// words (little endian, byte 0 first), the payload's 4-byte words. Indices
/// are compile-time constants once the callers are unrolled.
template <class T>
struct SplitRegs {
  static_assert(T::kUnits == 1 && SplitOf<T>::kHeadAt == 0, "SplitRegs holds a 32-element block, head first");
  static constexpr int kHeadWords = (SplitOf<T>::kHead + 3) / 4, kPayloadWords = SplitOf<T>::kPayload / 4;
  uint32_t head[kHeadWords];
  uint32_t payload[kPayloadWords];
};

#ifdef __CUDACC__
/// 16 bytes streamed from global memory: read once, so kept out of L1
/// (which the activations' loads use) -- ld.global.nc.L1::no_allocate.
__device__ __forceinline__ uint4 ld_stream16(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

/// Loads block s into registers: the payload in 16-byte loads, the head in
/// 4-byte loads when its size keeps them aligned, else 2-byte ones.
template <class T>
__device__ __forceinline__ void load_regs(const SplitPtr<T>& s, SplitRegs<T>& r) {
  constexpr int kHead = SplitOf<T>::kHead;
#pragma unroll
  for (int i = 0; i < SplitRegs<T>::kPayloadWords / 4; ++i) {
    const uint4 v = ld_stream16(s.payload + 16 * i);
    r.payload[4 * i] = v.x, r.payload[4 * i + 1] = v.y, r.payload[4 * i + 2] = v.z, r.payload[4 * i + 3] = v.w;
  }
  if constexpr (kHead % 4 == 0) {
#pragma unroll
    for (int i = 0; i < kHead / 4; ++i) r.head[i] = __ldg(reinterpret_cast<const uint32_t*>(s.head) + i);
  } else {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(s.head);
#pragma unroll
    for (int i = 0; i < SplitRegs<T>::kHeadWords; ++i) {
      const uint32_t lo = __ldg(h + 2 * i);
      const uint32_t hi = 2 * (2 * i + 1) < kHead ? uint32_t(__ldg(h + 2 * i + 1)) : 0u;
      r.head[i] = lo | (hi << 16);
    }
  }
}
#endif

/// Loads block s into registers on the host (the CPU tests of the sources).
template <class T>
void load_regs_host(const SplitPtr<T>& s, SplitRegs<T>& r) {
  uint8_t hb[4 * SplitRegs<T>::kHeadWords] = {};
  for (int i = 0; i < SplitOf<T>::kHead; ++i) hb[i] = s.head[i];
  for (int i = 0; i < SplitRegs<T>::kHeadWords; ++i)
    r.head[i] = uint32_t(hb[4 * i]) | uint32_t(hb[4 * i + 1]) << 8 | uint32_t(hb[4 * i + 2]) << 16 |
                uint32_t(hb[4 * i + 3]) << 24;
  for (int i = 0; i < SplitRegs<T>::kPayloadWords; ++i)
    r.payload[i] = uint32_t(s.payload[4 * i]) | uint32_t(s.payload[4 * i + 1]) << 8 |
                   uint32_t(s.payload[4 * i + 2]) << 16 | uint32_t(s.payload[4 * i + 3]) << 24;
}

}  // namespace activekv::cuda::qsplit

namespace activekv::cuda::qblk {

template <int Align, class T>
AKV_QHD uint32_t src_u32(const qsplit::SplitRegs<T>& s, int off) {
  constexpr int kHead = qsplit::SplitOf<T>::kHead;
  if (off >= kHead) return s.payload[(off - kHead) >> 2];  // kHead + 4k: aligned within the payload
  const int i = off >> 2;
  const uint32_t hi = i + 1 < qsplit::SplitRegs<T>::kHeadWords ? s.head[i + 1] : 0u;
  return (off & 3) == 0 ? s.head[i] : funnel_bytes(s.head[i], hi, off & 3);
}
template <class T>
AKV_QHD uint32_t src_u8(const qsplit::SplitRegs<T>& s, int off) {
  constexpr int kHead = qsplit::SplitOf<T>::kHead;
  if (off >= kHead) return (s.payload[(off - kHead) >> 2] >> (8 * ((off - kHead) & 3))) & 0xffu;
  return (s.head[off >> 2] >> (8 * (off & 3))) & 0xffu;
}
template <class T>
AKV_QHD float src_half(const qsplit::SplitRegs<T>& s, int off) {
  return reg_half_to_float(uint16_t(s.head[off >> 2] >> (8 * (off & 3))));
}

}  // namespace activekv::cuda::qblk
