// Internal to the CUDA backend: one 32-element unit of a Q4_K super-block
// in the split layout (quant_split.cuh) in a lane's registers, and its dot,
// for the register matvec (register_matvec.cu).
//
// A Q4_K super-block (256 elements, 8 units) is split into a 16-byte head
// (f16 d, f16 dmin, 12 bytes of 6-bit scales and mins) and a 128-byte
// payload whose unit u is bytes 16u .. 16u + 15 (element e < 16 the low
// nibble of byte e, 16 + e the high one). Both start 16-byte aligned, so a
// lane's unit is two 16-byte loads: 8 registers, where the GGUF layout's
// unit (the head and the 32-byte group it shares with its neighbour) took
// 12 for the same 18 bytes of the matrix.
//
// The lane's unit u is the same in every super-block it meets (its lane
// number mod 8), so which scale bytes and shifts it reads is fixed for the
// kernel: scale_min below picks them by u without the run-time byte indexing
// of the generic reader (quant_blocks.cuh's scale_min_k4 on a byte source),
// and dot_unit_x masks the codes out of the 4 payload words directly. The
// integers and floats are those of qdot::dot_unit_x<Q4_K> on the block's
// GGUF bytes, in the same order (tests/cuda/test_weights_host.cpp holds it
// bitwise on the CPU for every unit) -- but for NaN d or dmin, whose payload
// the device's f16 conversion may change, as the other register sources may.
#pragma once

#include <cstdint>

#include "quant_blocks.cuh"
#include "quant_dot.cuh"
#include "quant_split.cuh"

namespace activekv::cuda::qkregs {

using qblk::Q4_K;

struct UnitRegs {
  uint32_t head[4];  // the super-block's head: d | dmin << 16, then scale bytes 0..11, little endian
  uint32_t qs[4];    // the unit's 16 payload bytes
};

/// Where a lane's unit u of a split block is: its super-block's head and
/// its 16 payload bytes.
struct UnitAt {
  const uint8_t* head;
  const uint8_t* payload;
};

AKV_QHD UnitAt unit_at(const qsplit::SplitPtr<Q4_K>& s, int u) { return {s.head, s.payload + 16 * u}; }

#ifdef __CUDACC__
/// The unit at a into registers: two 16-byte streaming loads (read once,
/// kept out of L1: qsplit::ld_stream16). The 8 lanes of a super-block load
/// the same head in one instruction: one request.
__device__ __forceinline__ void load_unit(const UnitAt& a, UnitRegs& r) {
  const uint4 h = qsplit::ld_stream16(a.head), q = qsplit::ld_stream16(a.payload);
  r.head[0] = h.x, r.head[1] = h.y, r.head[2] = h.z, r.head[3] = h.w;
  r.qs[0] = q.x, r.qs[1] = q.y, r.qs[2] = q.z, r.qs[3] = q.w;
}
#endif

/// The same on the host (the CPU tests).
inline void load_unit_host(const UnitAt& a, UnitRegs& r) {
  for (int i = 0; i < 4; ++i) r.head[i] = qblk::ld32<4>(a.head + 4 * i), r.qs[i] = qblk::ld32<4>(a.payload + 4 * i);
}

/// Unit u's 6-bit scale and min: ggml's get_scale_min_k4 with the scale
/// bytes q[0..11] in head[1..3]. For u < 4, sc = q[u] & 63, m = q[u + 4] & 63;
/// for u >= 4 (k = u - 4), sc = (q[k + 8] & 15) | (q[k] >> 6) << 4 and m =
/// (q[k + 8] >> 4) | (q[k + 4] >> 6) << 4. Byte k (= u % 4) of words 1, 2, 3
/// is q[k], q[k + 4], q[k + 8]: one shift per word, the same for every block.
AKV_QHD void scale_min(const UnitRegs& r, int u, int& sc, int& m) {
  const int shift = 8 * (u & 3);
  const uint32_t q0 = r.head[1] >> shift, q4 = r.head[2] >> shift;
  if (u < 4) {
    sc = int(q0 & 63), m = int(q4 & 63);
  } else {
    const uint32_t q8 = r.head[3] >> shift;
    sc = int((q8 & 15) | ((q0 >> 6) & 3) << 4);
    m = int(((q8 >> 4) & 15) | ((q4 >> 6) & 3) << 4);
  }
}

/// qdot::dot_unit_x<Q4_K, NV> for unit u held in r: its codes masked out of
/// the payload words, its scale and min from scale_min by Q4_K's own
/// formulas, then the shared arithmetic (qdot::dot_unit_codes).
template <int NV>
AKV_QHD void dot_unit_x(const UnitRegs& r, int u, const qdot::UnitX<NV>& x, float* acc) {
  uint32_t c[8];
  AKV_UNROLL
  for (int g = 0; g < 4; ++g) {
    c[g] = r.qs[g] & 0x0f0f0f0fu;             // elements 4g .. 4g + 3
    c[g + 4] = (r.qs[g] >> 4) & 0x0f0f0f0fu;  // elements 16 + 4g ..
  }
  int sc, m;
  scale_min(r, u, sc, m);
  const float a = Q4_K::scale_of(qblk::reg_half_to_float(uint16_t(r.head[0])), sc);
  const float mn = Q4_K::min_of(qblk::reg_half_to_float(uint16_t(r.head[0] >> 16)), m);
  qdot::dot_unit_codes<Q4_K, NV>(c, a, mn, x, acc);
}

}  // namespace activekv::cuda::qkregs
