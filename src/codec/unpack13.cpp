// 13-bit code unpacking for lossless13: see unpack13.h.
#include "unpack13.h"

#include <bit>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define AKV_UNPACK13_AVX2 1
#endif

namespace activekv::kv::detail {
namespace {

constexpr uint32_t kCodeMask = 0x1fffu;

// bf16 bit pattern of one code: sign (bit 12) to bit 15, exponent from the
// table (pre-shifted to bits 7..14), mantissa (bits 0..6) unchanged.
inline uint32_t bf16_bits(uint32_t code, const uint16_t* exp_field) {
  return ((code & 0x1000u) << 3) | exp_field[(code >> 7) & 0x1fu] | (code & 0x7fu);
}

inline void put(uint16_t* out, size_t i, uint32_t bits) { out[i] = uint16_t(bits); }
inline void put(float* out, size_t i, uint32_t bits) { out[i] = std::bit_cast<float>(bits << 16); }

inline uint64_t load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// Eight codes are 13 bytes: codes 0..3 lie in the 64 bits at byte 0, codes
// 4..7 in the 64 bits at byte 5 (bits 40..103 of the group), so a whole
// group is read without touching the next one.
template <class Out>
void portable(const uint8_t* codes, size_t n, const uint8_t* table, Out* out) {
  uint16_t exp_field[32];
  for (int i = 0; i < 32; ++i) exp_field[i] = uint16_t(table[i] << 7);
  size_t i = 0;
  const uint8_t* p = codes;
  for (; i + 8 <= n; i += 8, p += 13) {
    const uint64_t lo = load64(p), hi = load64(p + 5);
    put(out, i + 0, bf16_bits(uint32_t(lo) & kCodeMask, exp_field));
    put(out, i + 1, bf16_bits(uint32_t(lo >> 13) & kCodeMask, exp_field));
    put(out, i + 2, bf16_bits(uint32_t(lo >> 26) & kCodeMask, exp_field));
    put(out, i + 3, bf16_bits(uint32_t(lo >> 39) & kCodeMask, exp_field));
    put(out, i + 4, bf16_bits(uint32_t(hi >> 12) & kCodeMask, exp_field));
    put(out, i + 5, bf16_bits(uint32_t(hi >> 25) & kCodeMask, exp_field));
    put(out, i + 6, bf16_bits(uint32_t(hi >> 38) & kCodeMask, exp_field));
    put(out, i + 7, bf16_bits(uint32_t(hi >> 51) & kCodeMask, exp_field));
  }
  // Fewer than 8 codes left: they start on a byte boundary (8 codes = 13 bytes).
  uint64_t acc = 0;
  int bits = 0;
  for (; i < n; ++i) {
    while (bits < 13) {
      acc |= uint64_t(*p++) << bits;
      bits += 8;
    }
    put(out, i, bf16_bits(uint32_t(acc) & kCodeMask, exp_field));
    acc >>= 13;
    bits -= 13;
  }
}

// Code i of a stream, read on its own (tails and error paths).
inline uint32_t code_at(const uint8_t* codes, size_t n, size_t i) {
  const size_t bit = 13 * i, byte = bit / 8, end = (13 * n + 7) / 8;
  uint32_t w = uint32_t(codes[byte]) | uint32_t(codes[byte + 1]) << 8;  // a code spans 2 or 3 bytes
  if (byte + 2 < end) w |= uint32_t(codes[byte + 2]) << 16;
  return (w >> (bit % 8)) & kCodeMask;
}

#ifdef AKV_UNPACK13_AVX2
// Eight codes per step: the group's 13 bytes (from a 16-byte load) are
// shuffled so that 32-bit lane i holds the three bytes code i starts in,
// shifted right by its bit offset and masked. The 5-bit table index picks
// the exponent from two 16-entry byte tables (pshufb) blended on bit 4.
__attribute__((target("avx2"))) inline __m256i avx2_group(const uint8_t* p, __m256i table_lo, __m256i table_hi) {
  const __m256i spread = _mm256_setr_epi8(0, 1, 2, -1, 1, 2, 3, -1, 3, 4, 5, -1, 4, 5, 6, -1,  //
                                          6, 7, 8, -1, 8, 9, 10, -1, 9, 10, 11, -1, 11, 12, 13, -1);
  const __m256i shift = _mm256_setr_epi32(0, 5, 2, 7, 4, 1, 6, 3);
  const __m256i bytes = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i code = _mm256_and_si256(_mm256_srlv_epi32(_mm256_shuffle_epi8(bytes, spread), shift),
                                        _mm256_set1_epi32(int(kCodeMask)));
  const __m256i index = _mm256_and_si256(_mm256_srli_epi32(code, 7), _mm256_set1_epi32(0x1f));
  // Bytes 1..3 of each lane get the high bit: pshufb writes zero there.
  const __m256i lookup = _mm256_or_si256(index, _mm256_set1_epi32(int(0x80808000u)));
  const __m256i exp = _mm256_blendv_epi8(_mm256_shuffle_epi8(table_lo, lookup), _mm256_shuffle_epi8(table_hi, lookup),
                                         _mm256_slli_epi32(index, 3));  // bit 4 -> bit 7 of byte 0
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(code, _mm256_set1_epi32(0x1000)), 3);
  return _mm256_or_si256(_mm256_or_si256(sign, _mm256_slli_epi32(exp, 7)),
                         _mm256_and_si256(code, _mm256_set1_epi32(0x7f)));
}

__attribute__((target("avx2"))) inline void avx2_store(uint16_t* out, __m256i bits) {
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), packed);
}
__attribute__((target("avx2"))) inline void avx2_store(float* out, __m256i bits) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_slli_epi32(bits, 16));
}

template <class Out>
__attribute__((target("avx2"))) void avx2(const uint8_t* codes, size_t n, const uint8_t* table, Out* out) {
  const __m256i table_lo = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(table)));
  const __m256i table_hi = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(table + 16)));
  // A group's 16-byte load reads 3 bytes past it: stop while they are in the stream.
  const size_t stream_bytes = (13 * n + 7) / 8;
  size_t i = 0;
  const uint8_t* p = codes;
  for (; i + 8 <= n && size_t(p - codes) + 16 <= stream_bytes; i += 8, p += 13) {
    avx2_store(out + i, avx2_group(p, table_lo, table_hi));
  }
  // GCC emits no vzeroupper before this tail call into baseline code; dirty
  // upper halves would slow every later SSE instruction of the process
  // (measured: attend_tile's softmax 4x slower after one unpack).
  _mm256_zeroupper();
  portable(p, n - i, table, out + i);
}
#endif

}  // namespace

size_t first_index_at_least(const uint8_t* codes, size_t n, uint32_t limit) {
  size_t i = 0;
  const uint8_t* p = codes;
  for (; i + 8 <= n; i += 8, p += 13) {  // groups of 8 as in portable(): two loads
    const uint64_t lo = load64(p), hi = load64(p + 5);
    const uint32_t idx[8] = {uint32_t(lo >> 7), uint32_t(lo >> 20), uint32_t(lo >> 33), uint32_t(lo >> 46),
                             uint32_t(hi >> 19), uint32_t(hi >> 32), uint32_t(hi >> 45), uint32_t(hi >> 58)};
    bool bad = false;
    for (uint32_t x : idx) bad |= (x & 0x1fu) >= limit;
    if (bad) break;  // find which one below
  }
  for (; i < n; ++i) {
    if (((code_at(codes, n, i) >> 7) & 0x1fu) >= limit) return i;
  }
  return n;
}

bool have_avx2() {
#ifdef AKV_UNPACK13_AVX2
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
#else
  return false;
#endif
}

void unpack13_portable(const uint8_t* codes, size_t n, const uint8_t* table, uint16_t* out) {
  portable(codes, n, table, out);
}
void unpack13_portable(const uint8_t* codes, size_t n, const uint8_t* table, float* out) {
  portable(codes, n, table, out);
}

#ifdef AKV_UNPACK13_AVX2
void unpack13_avx2(const uint8_t* codes, size_t n, const uint8_t* table, uint16_t* out) { avx2(codes, n, table, out); }
void unpack13_avx2(const uint8_t* codes, size_t n, const uint8_t* table, float* out) { avx2(codes, n, table, out); }
#else
void unpack13_avx2(const uint8_t* codes, size_t n, const uint8_t* table, uint16_t* out) {
  portable(codes, n, table, out);
}
void unpack13_avx2(const uint8_t* codes, size_t n, const uint8_t* table, float* out) {
  portable(codes, n, table, out);
}
#endif

void unpack13(const uint8_t* codes, size_t n, const uint8_t* table, uint16_t* out) {
  if (have_avx2()) {
    unpack13_avx2(codes, n, table, out);
  } else {
    portable(codes, n, table, out);
  }
}
void unpack13(const uint8_t* codes, size_t n, const uint8_t* table, float* out) {
  if (have_avx2()) {
    unpack13_avx2(codes, n, table, out);
  } else {
    portable(codes, n, table, out);
  }
}

}  // namespace activekv::kv::detail
