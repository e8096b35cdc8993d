// Internal: per-format block decoders. Each decodes `n_blocks` consecutive
// blocks from `src` into block_elements * n_blocks floats at `dst`.
// The arithmetic order mirrors ggml's dequantize_row_* (and gguf-py's numpy
// port) so results are bit-identical: e.g. Q4_K is (d*sc)*q - (dmin*m).
#pragma once

#include <cstdint>

namespace activekv::gguf::detail {

void dequant_q4_0(const uint8_t* src, float* dst, uint64_t n_blocks);
void dequant_q4_1(const uint8_t* src, float* dst, uint64_t n_blocks);
void dequant_q5_0(const uint8_t* src, float* dst, uint64_t n_blocks);
void dequant_q8_0(const uint8_t* src, float* dst, uint64_t n_blocks);
void dequant_q4_k(const uint8_t* src, float* dst, uint64_t n_blocks);
void dequant_q5_k(const uint8_t* src, float* dst, uint64_t n_blocks);
void dequant_q6_k(const uint8_t* src, float* dst, uint64_t n_blocks);

}  // namespace activekv::gguf::detail
