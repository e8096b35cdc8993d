// Internal: unpacking a lossless13 plane's 13-bit codes (layout in
// include/activekv/kv/codec_lossless13.h). This is the inner loop of every
// lossless13 read on the CPU, so it has a portable version (8 codes from two
// 64-bit loads) and an AVX2 version (8 codes per byte shuffle, exponent
// table looked up with two byte shuffles), chosen once at run time. Both
// give the same bits; the codes must have been validated (every table
// index < the table size), nothing is checked here.
#pragma once

#include <cstddef>
#include <cstdint>

namespace activekv::kv::detail {

/// Decodes n codes from the LSB-first 13-bit stream at `codes` (ceil(13n/8)
/// bytes readable) with the exponent table `table` (32 entries; entries past
/// the plane's table size are never addressed). Output: bf16 bit patterns,
/// or the same values widened exactly to fp32.
void unpack13(const uint8_t* codes, size_t n, const uint8_t* table, uint16_t* out);
void unpack13(const uint8_t* codes, size_t n, const uint8_t* table, float* out);

/// Index of the first code whose table index (bits 7..11) is >= limit, or n
/// if there is none: the validation of a table plane (same stream layout).
size_t first_index_at_least(const uint8_t* codes, size_t n, uint32_t limit);

/// The two implementations, for tests that compare them; the AVX2 ones may
/// be called only when have_avx2().
void unpack13_portable(const uint8_t* codes, size_t n, const uint8_t* table, uint16_t* out);
void unpack13_portable(const uint8_t* codes, size_t n, const uint8_t* table, float* out);
void unpack13_avx2(const uint8_t* codes, size_t n, const uint8_t* table, uint16_t* out);
void unpack13_avx2(const uint8_t* codes, size_t n, const uint8_t* table, float* out);
/// Whether this CPU runs AVX2 (and the build has the AVX2 version).
bool have_avx2();

}  // namespace activekv::kv::detail
