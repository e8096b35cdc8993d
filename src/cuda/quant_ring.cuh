// Internal to the CUDA backend: a split matrix's item in a lane's slot of
// shared memory, for the ring matvec (ring_matvec.cu). RingItem<T>::copy
// sends an item's bytes from the matrix to the slot with cp.async (nothing
// held in registers while they travel); RingItem<T>::read takes them from
// the slot into the same registers the register kernel loads from the
// matrix (RegItems<T>::Regs, register_items.cuh), so the dot and its bits
// are the register kernel's.
//
// A slot holds one item of each of a warp's 32 lanes, kSlotBytes = 32 x
// kBytes: each piece of the item (16, 8 or 4 bytes) as an array over the
// lanes, so that the 32 lanes' reads of a piece are consecutive and free of
// bank conflicts. cp.async copies 4 bytes at least, aligned: a 2-byte f16
// head (Q4_0, Q8_0, Q6_K's d) comes as the aligned word that holds it, and
// read shifts it out by the address it came from.
#pragma once

#include <cstdint>
#include <type_traits>

#include "mma_util.cuh"
#include "register_items.cuh"

namespace activekv::cuda::regmv {

namespace ring {

__device__ __forceinline__ uint4 lds16(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}
__device__ __forceinline__ uint2 lds8(uint32_t a) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(a));
  return v;
}
__device__ __forceinline__ uint32_t lds4(uint32_t a) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(a));
  return v;
}

/// The aligned 4-byte word that holds the 2-byte value at p, and the value
/// out of it (little endian: the low half when p is 4-byte aligned).
__device__ __forceinline__ const void* word_of(const uint8_t* p) {
  return reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t(3));
}
__device__ __forceinline__ uint32_t half_of(uint32_t word, const uint8_t* p) {
  return (word >> (8 * (reinterpret_cast<uintptr_t>(p) & 2))) & 0xffffu;
}

}  // namespace ring

/// kOk: the ring kernel reads T's items. Q5_0's 6-byte head has no ring item
/// (it keeps the register kernel).
template <class T, class = void>
struct RingItem {
  static constexpr bool kOk = false;
};

/// The 32-element split types with a 2- or 4-byte head (Q4_0, Q4_1, Q8_0):
/// the payload's 16-byte chunks, then the head's word.
template <class T>
struct RingItem<T, std::enable_if_t<RegItems<T>::kOk && T::kUnits == 1 &&
                                    (SplitOf<T>::kHead == 2 || SplitOf<T>::kHead == 4)>> {
  static constexpr bool kOk = true;
  static constexpr int kChunks = SplitOf<T>::kPayload / 16;
  static constexpr int kBytes = 16 * kChunks + 4, kSlotBytes = 32 * kBytes;
  using Lane = typename RegItems<T>::Lane;
  using Regs = typename RegItems<T>::Regs;
  __device__ __forceinline__ static void copy(const Lane& a, uint32_t slot, int lane) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) detail::cp_async16(slot + 512 * c + 16 * lane, a.payload + 16 * c, 16);
    detail::cp_async_ca<4>(slot + 512 * kChunks + 4 * lane, ring::word_of(a.head));
  }
  __device__ __forceinline__ static void read(uint32_t slot, int lane, const Lane& a, Regs& r) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const uint4 v = ring::lds16(slot + 512 * c + 16 * lane);
      r.payload[4 * c] = v.x, r.payload[4 * c + 1] = v.y, r.payload[4 * c + 2] = v.z, r.payload[4 * c + 3] = v.w;
    }
    const uint32_t h = ring::lds4(slot + 512 * kChunks + 4 * lane);
    r.head[0] = SplitOf<T>::kHead == 4 ? h : ring::half_of(h, a.head);  // load_regs: the f16 zero-extended
  }
};

/// Q4_K: the unit's super-block head (16 bytes), then its 16 payload bytes.
template <>
struct RingItem<qblk::Q4_K> {
  static constexpr bool kOk = true;
  static constexpr int kBytes = 32, kSlotBytes = 32 * kBytes;
  using Lane = qkregs::UnitAt;
  using Regs = qkregs::UnitRegs;
  __device__ __forceinline__ static void copy(const Lane& a, uint32_t slot, int lane) {
    detail::cp_async16(slot + 16 * lane, a.head, 16);
    detail::cp_async16(slot + 512 + 16 * lane, a.payload, 16);
  }
  __device__ __forceinline__ static void read(uint32_t slot, int lane, const Lane&, Regs& r) {
    const uint4 h = ring::lds16(slot + 16 * lane), q = ring::lds16(slot + 512 + 16 * lane);
    r.head[0] = h.x, r.head[1] = h.y, r.head[2] = h.z, r.head[3] = h.w;
    r.qs[0] = q.x, r.qs[1] = q.y, r.qs[2] = q.z, r.qs[3] = q.w;
  }
};

/// Q6_K: the item's four 8-byte pieces (ql, ql + 32, qh, scales), then d's word.
template <>
struct RingItem<qblk::Q6_K> {
  static constexpr bool kOk = true;
  static constexpr int kBytes = 36, kSlotBytes = 32 * kBytes;
  using Lane = qsplit::Q6kItemAt;
  using Regs = qsplit::Q6kItemRegs;
  __device__ __forceinline__ static void copy(const Lane& a, uint32_t slot, int lane) {
    detail::cp_async_ca<8>(slot + 8 * lane, a.ql);
    detail::cp_async_ca<8>(slot + 256 + 8 * lane, a.ql + 32);
    detail::cp_async_ca<8>(slot + 512 + 8 * lane, a.qh);
    detail::cp_async_ca<8>(slot + 768 + 8 * lane, a.sc);
    detail::cp_async_ca<4>(slot + 1024 + 4 * lane, ring::word_of(a.d));
  }
  __device__ __forceinline__ static void read(uint32_t slot, int lane, const Lane& a, Regs& r) {
    const uint2 l0 = ring::lds8(slot + 8 * lane), l1 = ring::lds8(slot + 256 + 8 * lane);
    const uint2 qh = ring::lds8(slot + 512 + 8 * lane), sc = ring::lds8(slot + 768 + 8 * lane);
    r.ql[0][0] = l0.x, r.ql[0][1] = l0.y, r.ql[1][0] = l1.x, r.ql[1][1] = l1.y;
    r.qh[0] = qh.x, r.qh[1] = qh.y, r.sc[0] = sc.x, r.sc[1] = sc.y;
    r.d = ring::half_of(ring::lds4(slot + 1024 + 4 * lane), a.d);
  }
};

}  // namespace activekv::cuda::regmv
