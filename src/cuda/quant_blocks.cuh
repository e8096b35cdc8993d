// Internal to the CUDA backend: device-side decoding of the ggml block types
// (ggml-common.h), shared by the matvec, gather and dequantise kernels so
// each layout is written once. Mirrors src/gguf/dequant*.cpp (the CPU
// decoder, bit-identical to gguf-py); see that code for the layouts in prose.
//
// Every block type is described by a traits struct with the same interface:
//   kType, kElems, kBytes      the GGUF block
//   kAlign                     guaranteed alignment of a block (bytes) when the
//                              tensor data is 16-byte aligned (rows of whole blocks)
//   kUnits                     32-element units per block (1 or 8)
//   kPiece                     elements one dequantising thread handles (32)
//   kHasMin                    value = A*code + B (else value = A*code)
//   kOffset, kScale16          see raw4; A changes every 16 elements (Q6_K)
//   raw4(b, u, g)              codes of elements 4g..4g+3 of unit u plus kOffset,
//                              one byte each (< 0x80; element 4g in the low byte)
//   scale(b, u, g)             A of those elements (fp32, exactly as the CPU computes it)
//   min(b, u)                  B of unit u (kHasMin only)
// and codes4<T>(b, u, g) = raw4 - kOffset per byte (signed int8 codes), so
// element 32u + 4g + k of a block dequantises to A*code_k (+ B). `b` is a
// byte source (a pointer, or a tile in registers: see "byte sources"). The
// dequantisers evaluate exactly the CPU expression with explicitly rounded
// operations (no FMA contraction); the matvec takes integer dot products of
// the codes with int8 activations and applies A (and B) per unit.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "activekv/gguf/tensor_type.h"

namespace activekv::cuda::qblk {

// ---- portable primitives -------------------------------------------------------
// Everything here is __host__ __device__ so the CPU tests can run the very
// code the kernels run (tests/cuda/test_weights_host.cpp); the device takes
// the intrinsics, the host their exact scalar equivalents.

#define AKV_QHD __host__ __device__ __forceinline__
#ifdef __CUDACC__
#define AKV_UNROLL _Pragma("unroll")
#else
#define AKV_UNROLL
#endif

AKV_QHD uint32_t f32_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

AKV_QHD float bits_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

/// a * b and a + b, each rounded once (never contracted into an FMA).
AKV_QHD float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;  // host: ISO C++ mode, no contraction
#endif
}
AKV_QHD float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

/// c + sum_k a_k * b_k over the four signed bytes.
AKV_QHD int dp4a(int a, int b, int c) {
#ifdef __CUDA_ARCH__
  return __dp4a(a, b, c);
#else
  for (int k = 0; k < 4; ++k) c += int(int8_t(uint32_t(a) >> (8 * k))) * int(int8_t(uint32_t(b) >> (8 * k)));
  return c;
#endif
}

/// Read-only load of global memory (through the non-coherent cache on the device).
template <class V>
AKV_QHD V ldg(const V* p) {
#ifdef __CUDA_ARCH__
  return __ldg(p);
#else
  return *p;
#endif
}

/// 16- and 32-bit little-endian loads; ld32 from an address aligned to
/// `Align` (2 or 4) bytes.
AKV_QHD uint16_t ld16(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  return *reinterpret_cast<const uint16_t*>(p);
#else
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
#endif
}

template <int Align>
AKV_QHD uint32_t ld32(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  if constexpr (Align >= 4) return *reinterpret_cast<const uint32_t*>(p);
#endif
  return uint32_t(ld16(p)) | (uint32_t(ld16(p + 2)) << 16);
}

/// 16-byte load from a 16-byte aligned address.
AKV_QHD uint4 ld128(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  return *reinterpret_cast<const uint4*>(p);
#else
  uint4 v;
  std::memcpy(&v, p, 16);
  return v;
#endif
}

/// Exact binary16 -> binary32 by bit manipulation, as src/gguf/fp16.h (NaN
/// payloads kept, subnormals exact; the hardware cvt may canonicalise NaNs).
AKV_QHD float half_bits_to_float(uint16_t h) {
#ifdef __CUDA_ARCH__
  // The hardware conversion is exact for everything but NaN payloads: a few
  // instructions instead of a dozen and two branches in the matvec's loop.
  if ((h & 0x7fffu) <= 0x7c00u) return __half2float(__ushort_as_half(h));
#endif
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) return bits_f32(sign | f32_bits(mul_rn(float(mant), 0x1p-24f)));
  return bits_f32(sign | ((exp + (127 - 15)) << 23) | (mant << 13));
}

AKV_QHD float ld_half(const uint8_t* p) { return half_bits_to_float(ld16(p)); }

/// binary16 -> binary32 for the byte sources in registers: by the hardware
/// on the device (exact but for NaN payloads, which the matvec does not
/// promise to keep), by bits on the host.
AKV_QHD float reg_half_to_float(uint16_t h) {
#ifdef __CUDA_ARCH__
  return __half2float(__ushort_as_half(h));
#else
  return half_bits_to_float(h);
#endif
}

/// f32 -> bf16 bits, round to nearest even, NaN quieted: activekv/core/bf16.h.
AKV_QHD uint16_t f32_to_bf16_bits(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/// Byte k of a packed code word as a signed integer.
AKV_QHD int code_at(uint32_t w, int k) { return int(int8_t(w >> (8 * k))); }

/// Byte-wise c - k (mod 256 per byte) for c with every byte < 0x80 and k with
/// every byte <= 0x80: setting each byte's top bit first means no byte borrows
/// from the next, and flipping it back subtracts 0x80 again. Three integer
/// operations where the device's __vsub4 takes several more.
AKV_QHD uint32_t sub_bytes(uint32_t c, uint32_t k) { return ((c | 0x80808080u) - k) ^ 0x80808080u; }

/// The low 4 bits of h spread to bit 4 of the four bytes (bit k -> byte k):
/// the fifth bits of four 5-bit codes.
AKV_QHD uint32_t fifth_bits4(uint32_t h) {
  return ((h & 1u) << 4) | ((h & 2u) << 11) | ((h & 4u) << 18) | ((h & 8u) << 25);
}

/// Bytes (hi:lo) >> 8*k for k in 0..3 (a funnel shift).
AKV_QHD uint32_t funnel_bytes(uint32_t lo, uint32_t hi, int k) {
#ifdef __CUDA_ARCH__
  return __funnelshift_r(lo, hi, 8 * k);
#else
  return uint32_t(((uint64_t(hi) << 32) | lo) >> (8 * k));
#endif
}

// ---- byte sources ----------------------------------------------------------------
// The traits read a block through a source: a pointer into memory (global or
// shared; the gather/dequantise kernels and the chunked matvec), or a tile of
// a row held in registers (the tiled matvec, quant_tile.cuh). Offsets are in
// bytes from the block's start and even; reads of 4 bytes are from offsets
// aligned to the traits' kAlign.

template <int Align>
AKV_QHD uint32_t src_u32(const uint8_t* p, int off) { return ld32<Align>(p + off); }
AKV_QHD uint32_t src_u8(const uint8_t* p, int off) { return p[off]; }
/// Exact binary16 (NaN payloads kept: the dequantisers are bitwise gguf::dequantize).
AKV_QHD float src_half(const uint8_t* p, int off) { return ld_half(p + off); }

/// N little-endian words of bytes in registers (indices are compile-time
/// constants once the callers are unrolled, so nothing goes to local memory).
template <int N>
struct Words {
  uint32_t w[N];
};

/// A block inside a Words tile: its bytes start at byte `base` of *t.
template <int N>
struct WordsAt {
  const Words<N>* t;
  int base;
};

template <int Align, int N>
AKV_QHD uint32_t src_u32(const WordsAt<N>& s, int off) {
  const int o = s.base + off, i = o >> 2;
  if ((o & 3) == 0) return s.t->w[i];
  return funnel_bytes(s.t->w[i], s.t->w[i + 1 < N ? i + 1 : N - 1], o & 3);
}
template <int N>
AKV_QHD uint32_t src_u8(const WordsAt<N>& s, int off) {
  const int o = s.base + off;
  return (s.t->w[o >> 2] >> (8 * (o & 3))) & 0xffu;
}
template <int N>
AKV_QHD float src_half(const WordsAt<N>& s, int off) {
  const int o = s.base + off;
  return reg_half_to_float(uint16_t(s.t->w[o >> 2] >> (8 * (o & 3))));
}

/// 6-bit scale and min of sub-block j of the 12-byte array at `off` of Q4_K/Q5_K
/// (ggml's get_scale_min_k4).
template <class S>
AKV_QHD void scale_min_k4(const S& b, int off, int j, int& sc, int& m) {
  if (j < 4) {
    sc = int(src_u8(b, off + j) & 63);
    m = int(src_u8(b, off + j + 4) & 63);
  } else {
    sc = int((src_u8(b, off + j + 4) & 0x0f) | ((src_u8(b, off + j - 4) >> 6) << 4));
    m = int((src_u8(b, off + j + 4) >> 4) | ((src_u8(b, off + j) >> 6) << 4));
  }
}

// ---- 32-element block types --------------------------------------------------
// Besides codes4 (the signed codes), each type gives raw4, the codes before
// the constant kOffset is subtracted (bytes < 0x80), so that the matvec can
// dot the raw codes and subtract kOffset * sum(x) once per unit. Q6_K's
// scale changes every 16 elements (kScale16), so its matvec takes the offset
// per 8 elements instead (quant_dot.cuh: dot_q6k_item_x).

/// f16 d, 16 bytes of nibbles: element j < 16 is the low nibble of qs[j],
/// element 16 + j the high one; value = (nibble - 8) * d.
struct Q4_0 {
  static constexpr gguf::TensorType kType = gguf::TensorType::Q4_0;
  static constexpr int kElems = 32, kBytes = 18, kAlign = 2, kUnits = 1, kPiece = 32, kOffset = 8;
  static constexpr bool kHasMin = false, kScale16 = false;
  template <class S>
  AKV_QHD static uint32_t raw4(const S& b, int /*u*/, int g) {
    return (src_u32<kAlign>(b, 2 + 4 * (g & 3)) >> (4 * (g >> 2))) & 0x0f0f0f0fu;
  }
  template <class S>
  AKV_QHD static float scale(const S& b, int, int) { return src_half(b, 0); }
};

/// f16 d, f16 m, 16 bytes of nibbles (as Q4_0); value = nibble * d + m.
struct Q4_1 {
  static constexpr gguf::TensorType kType = gguf::TensorType::Q4_1;
  static constexpr int kElems = 32, kBytes = 20, kAlign = 4, kUnits = 1, kPiece = 32, kOffset = 0;
  static constexpr bool kHasMin = true, kScale16 = false;
  template <class S>
  AKV_QHD static uint32_t raw4(const S& b, int, int g) {
    return (src_u32<kAlign>(b, 4 + 4 * (g & 3)) >> (4 * (g >> 2))) & 0x0f0f0f0fu;
  }
  template <class S>
  AKV_QHD static float scale(const S& b, int, int) { return src_half(b, 0); }
  template <class S>
  AKV_QHD static float min(const S& b, int) { return src_half(b, 2); }
};

/// f16 d, 4 bytes qh, 16 bytes of nibbles (as Q4_0): bit j of qh (little-endian
/// u32) is the fifth bit of element j; value = (code - 16) * d. Gemma 3 270M's
/// Q4_K_M file stores attn_q/attn_k/ffn_gate/ffn_up in Q5_0.
struct Q5_0 {
  static constexpr gguf::TensorType kType = gguf::TensorType::Q5_0;
  static constexpr int kElems = 32, kBytes = 22, kAlign = 2, kUnits = 1, kPiece = 32, kOffset = 16;
  static constexpr bool kHasMin = false, kScale16 = false;
  template <class S>
  AKV_QHD static uint32_t raw4(const S& b, int /*u*/, int g) {
    const uint32_t lo = (src_u32<kAlign>(b, 6 + 4 * (g & 3)) >> (4 * (g >> 2))) & 0x0f0f0f0fu;
    return lo | fifth_bits4(src_u32<kAlign>(b, 2) >> (4 * g));
  }
  template <class S>
  AKV_QHD static float scale(const S& b, int, int) { return src_half(b, 0); }
};

/// f16 d, 32 int8; value = q * d.
struct Q8_0 {
  static constexpr gguf::TensorType kType = gguf::TensorType::Q8_0;
  static constexpr int kElems = 32, kBytes = 34, kAlign = 2, kUnits = 1, kPiece = 32, kOffset = 0;
  static constexpr bool kHasMin = false, kScale16 = false;
  template <class S>
  AKV_QHD static uint32_t raw4(const S& b, int, int g) { return src_u32<kAlign>(b, 2 + 4 * g); }
  template <class S>
  AKV_QHD static float scale(const S& b, int, int) { return src_half(b, 0); }
};

// ---- K-quants: 256-element super-blocks ------------------------------------------

/// f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles.
/// Sub-block u (32 elements) is the low (u even) or high (u odd) nibbles of
/// qs[32*(u/2) .. +32); value = (d*sc_u) * q - (dmin*m_u).
struct Q4_K {
  static constexpr gguf::TensorType kType = gguf::TensorType::Q4_K;
  static constexpr int kElems = 256, kBytes = 144, kAlign = 16, kUnits = 8, kPiece = 32, kOffset = 0;
  static constexpr bool kHasMin = true, kScale16 = false;
  template <class S>
  AKV_QHD static uint32_t raw4(const S& b, int u, int g) {
    return (src_u32<4>(b, 16 + 32 * (u >> 1) + 4 * g) >> (4 * (u & 1))) & 0x0f0f0f0fu;
  }
  /// Unit scale and min from d, dmin and the unit's 6-bit sc and m (also
  /// qkregs::dot_unit_x's, which finds sc and m its own way).
  AKV_QHD static float scale_of(float d, int sc) { return mul_rn(d, float(sc)); }
  AKV_QHD static float min_of(float dmin, int m) { return -mul_rn(dmin, float(m)); }
  template <class S>
  AKV_QHD static float scale(const S& b, int u, int) {
    int sc, m;
    scale_min_k4(b, 4, u, sc, m);
    return scale_of(src_half(b, 0), sc);
  }
  template <class S>
  AKV_QHD static float min(const S& b, int u) {
    int sc, m;
    scale_min_k4(b, 4, u, sc, m);
    return min_of(src_half(b, 2), m);
  }
};

/// Q4_K plus 32 bytes qh after the scales (nibbles at 48): bit u of qh[l] is
/// the fifth bit of element l of sub-block u.
struct Q5_K {
  static constexpr gguf::TensorType kType = gguf::TensorType::Q5_K;
  static constexpr int kElems = 256, kBytes = 176, kAlign = 16, kUnits = 8, kPiece = 32, kOffset = 0;
  static constexpr bool kHasMin = true, kScale16 = false;
  template <class S>
  AKV_QHD static uint32_t raw4(const S& b, int u, int g) {
    const uint32_t lo = (src_u32<4>(b, 48 + 32 * (u >> 1) + 4 * g) >> (4 * (u & 1))) & 0x0f0f0f0fu;
    const uint32_t hi = ((src_u32<4>(b, 16 + 4 * g) >> u) & 0x01010101u) << 4;
    return lo | hi;
  }
  template <class S>
  AKV_QHD static float scale(const S& b, int u, int g) { return Q4_K::scale(b, u, g); }
  template <class S>
  AKV_QHD static float min(const S& b, int u) { return Q4_K::min(b, u); }
};

/// 128 bytes ql, 64 bytes qh, 16 int8 scales, f16 d (at 208). Half h = u/4
/// (128 elements), k = u%4: element l of sub-block u takes its low 4 bits from
/// ql[64h + 32*(k&1) + l] (low nibble for k < 2, high for k >= 2) and its top
/// 2 bits from qh[32h + l] >> 2k; value = (d * sc[8h + 2k + l/16]) * (q - 32).
struct Q6_K {
  static constexpr gguf::TensorType kType = gguf::TensorType::Q6_K;
  static constexpr int kElems = 256, kBytes = 210, kAlign = 2, kUnits = 8, kPiece = 32, kOffset = 32;
  static constexpr bool kHasMin = false, kScale16 = true;
  template <class S>
  AKV_QHD static uint32_t raw4(const S& b, int u, int g) {
    const int h = u >> 2, k = u & 3;
    const uint32_t lo = (src_u32<kAlign>(b, 64 * h + 32 * (k & 1) + 4 * g) >> (4 * (k >> 1))) & 0x0f0f0f0fu;
    const uint32_t hi = ((src_u32<kAlign>(b, 128 + 32 * h + 4 * g) >> (2 * k)) & 0x03030303u) << 4;
    return lo | hi;
  }
  template <class S>
  AKV_QHD static float scale(const S& b, int u, int g) {
    const int h = u >> 2, k = u & 3;
    const int sc = int(int8_t(src_u8(b, 192 + 8 * h + 2 * k + (g >> 2))));
    return mul_rn(src_half(b, 208), float(sc));
  }
};

/// Codes of elements 4g..4g+3 of unit u, one signed int8 per byte (element
/// 4g in the low byte).
template <class T, class S>
AKV_QHD uint32_t codes4(const S& b, int u, int g) {
  const uint32_t raw = T::raw4(b, u, g);
  if constexpr (T::kOffset == 0) return raw;
  return sub_bytes(raw, 0x01010101u * uint32_t(T::kOffset));
}

/// Dequantises elements 4g..4g+3 of unit u of block b into out[0..3],
/// bit-identical to gguf::dequantize.
template <class T, class S>
AKV_QHD void dequant4(const S& b, int u, int g, float* out) {
  const uint32_t c = codes4<T>(b, u, g);
  const float a = T::scale(b, u, g);
  if constexpr (T::kHasMin) {
    const float m = T::min(b, u);
AKV_UNROLL
    for (int k = 0; k < 4; ++k) out[k] = add_rn(mul_rn(a, float(code_at(c, k))), m);
  } else {
AKV_UNROLL
    for (int k = 0; k < 4; ++k) out[k] = mul_rn(a, float(code_at(c, k)));
  }
}

// ---- element types -------------------------------------------------------------

/// F32 / F16 / BF16: decode8(row, e) writes elements e..e+7 (e a multiple of 8;
/// rows of these types are 16-byte aligned since cols % 8 == 0); kPiece = 8.
struct F32 {
  static constexpr gguf::TensorType kType = gguf::TensorType::F32;
  static constexpr int kElemBytes = 4, kPiece = 8;
  AKV_QHD static void decode8(const uint8_t* row, int64_t e, float* out) {
    const uint4 a = ld128(row + 4 * e), c = ld128(row + 4 * e + 16);
    const uint32_t w[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
AKV_UNROLL
    for (int i = 0; i < 8; ++i) out[i] = bits_f32(w[i]);
  }
};

struct F16 {
  static constexpr gguf::TensorType kType = gguf::TensorType::F16;
  static constexpr int kElemBytes = 2, kPiece = 8;
  AKV_QHD static void decode8(const uint8_t* row, int64_t e, float* out) {
    const uint4 v = ld128(row + 2 * e);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
AKV_UNROLL
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = half_bits_to_float(uint16_t(w[i]));
      out[2 * i + 1] = half_bits_to_float(uint16_t(w[i] >> 16));
    }
  }
};

struct BF16 {
  static constexpr gguf::TensorType kType = gguf::TensorType::BF16;
  static constexpr int kElemBytes = 2, kPiece = 8;
  AKV_QHD static void decode8(const uint8_t* row, int64_t e, float* out) {
    const uint4 v = ld128(row + 2 * e);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
AKV_UNROLL
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = bits_f32(w[i] << 16);
      out[2 * i + 1] = bits_f32(w[i] & 0xffff0000u);
    }
  }
};

/// Calls f(Traits{}) for the traits struct of `t`; returns false if `t` has none.
template <class F>
bool dispatch_block_type(gguf::TensorType t, F&& f) {
  switch (t) {
    case gguf::TensorType::Q4_0: f(Q4_0{}); return true;
    case gguf::TensorType::Q4_1: f(Q4_1{}); return true;
    case gguf::TensorType::Q5_0: f(Q5_0{}); return true;
    case gguf::TensorType::Q8_0: f(Q8_0{}); return true;
    case gguf::TensorType::Q4_K: f(Q4_K{}); return true;
    case gguf::TensorType::Q5_K: f(Q5_K{}); return true;
    case gguf::TensorType::Q6_K: f(Q6_K{}); return true;
    default: return false;
  }
}

template <class F>
bool dispatch_float_type(gguf::TensorType t, F&& f) {
  switch (t) {
    case gguf::TensorType::F32: f(F32{}); return true;
    case gguf::TensorType::F16: f(F16{}); return true;
    case gguf::TensorType::BF16: f(BF16{}); return true;
    default: return false;
  }
}

}  // namespace activekv::cuda::qblk
