// ggml tensor types and their block layouts, and dequantisation to F32.
//
// Block layouts follow ggml (ggml-common.h): a row of n elements of a block
// type is n / block_elements blocks of block_bytes each. Dequantisation is
// our own code and is tested against the `gguf` Python package's numpy
// dequantiser (tools/make_gguf_fixtures.py).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace activekv::gguf {

/// ggml_type ids (ggml.h). Only the ones we dequantise are named; any other
/// id is "unknown" and rejected when its layout is needed.
enum class TensorType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q8_0 = 8,
  Q4_K = 12, Q5_K = 13, Q6_K = 14, BF16 = 30,
};

/// True for the types listed above.
bool is_supported(TensorType t);
/// "F32", "Q4_K", ...; "type#<id>" for unknown ids.
std::string type_name(TensorType t);
/// Elements per block (1 for F32/F16/BF16, 32 for Q4_0/Q4_1/Q5_0/Q8_0, 256 for K-quants).
/// Throws Error for an unsupported type.
size_t block_elements(TensorType t);
/// Bytes per block. Throws Error for an unsupported type.
size_t block_bytes(TensorType t);
/// Bytes of a row of n elements. Throws Error if n is not a multiple of the
/// block size or the type is unsupported.
size_t row_bytes(TensorType t, uint64_t n);

/// Exact IEEE-754 binary16 -> binary32 widening (subnormals, +-0, inf and NaN
/// payloads preserved), bit-identical to numpy's float16 -> float32 cast.
float f16_to_f32(uint16_t bits);

/// Dequantises `n` elements (a multiple of block_elements(t)) from `src`
/// (which must hold row_bytes(t, n) bytes) into `dst` (n floats).
/// Throws Error for an unsupported type or a bad n.
void dequantize(TensorType t, const uint8_t* src, float* dst, uint64_t n);

}  // namespace activekv::gguf
