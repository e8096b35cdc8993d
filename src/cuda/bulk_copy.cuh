// Hopper bulk copies (the TMA engine without a tensor map) and the shared-
// memory barriers they complete on. Internal header (src/cuda only).
//
// Why: a ring filled by 16-byte cp.async copies keeps each SM's outstanding
// global loads in the load/store unit, one request per lane and chunk; a
// bulk copy hands a whole row to the copy engine in one instruction and
// counts its bytes on an mbarrier (PTX ISA: "cp.async.bulk", "mbarrier"). A
// consumer waits for the barrier's phase, not for a commit group.
//
// Usage per ring stage: one lane calls mbar_expect_tx(bar, bytes) for every
// byte the stage's copies will bring, then (after __syncwarp) any lanes issue
// bulk_copy_g2s(..., bar); readers wait with mbar_wait(bar, parity), parity
// flipping on each reuse of the barrier (use n of a stage: n & 1).
// Every instruction here needs sm_90; on older targets they trap (the host
// never selects them there: split_copy_bulk_built()).
#pragma once

#include <cstdint>

namespace activekv::cuda::detail {

/// Whether every architecture of this build has the bulk-copy instructions.
__host__ __device__ constexpr bool split_copy_bulk_built() {
#if defined(ACTIVEKV_SM90_BUILD) && ACTIVEKV_SM90_BUILD
  return true;
#else
  return false;
#endif
}

/// Initialises the mbarrier at shared address `bar` (8 bytes, 8-aligned) for
/// `count` arrivals per phase and makes it visible to the copy engine.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#else
  __trap();
#endif
}

/// Arrives once on `bar` and adds `bytes` to the transaction count its
/// current phase waits for.
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#else
  __trap();
#endif
}

/// Spins until the phase of `bar` with parity `parity` has completed; the
/// bytes the phase counted are then visible to the calling thread.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
#else
  __trap();
#endif
}

/// Copies `bytes` (a multiple of 16; src and dst 16-byte aligned) from
/// global `src` to shared `dst`; completion counts the bytes on `bar`.
__device__ __forceinline__ void bulk_copy_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
#else
  __trap();
#endif
}

/// Stores 16 zero bytes at shared address `dst` (16-byte aligned).
__device__ __forceinline__ void st_shared_zero16(uint32_t dst) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(dst), "r"(0u) : "memory");
}

}  // namespace activekv::cuda::detail
