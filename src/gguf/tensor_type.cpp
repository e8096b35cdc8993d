// Block geometry of the supported ggml tensor types (ggml-common.h).
#include "activekv/gguf/tensor_type.h"

#include "activekv/core/error.h"

namespace activekv::gguf {

namespace {

struct Layout {
  const char* name;
  size_t elements;
  size_t bytes;
};

/// nullptr for ids we do not support.
const Layout* layout(TensorType t) {
  static constexpr Layout kF32{"F32", 1, 4}, kF16{"F16", 1, 2}, kBF16{"BF16", 1, 2},
      kQ4_0{"Q4_0", 32, 2 + 16}, kQ4_1{"Q4_1", 32, 2 + 2 + 16}, kQ5_0{"Q5_0", 32, 2 + 4 + 16}, kQ8_0{"Q8_0", 32, 2 + 32},
      kQ4_K{"Q4_K", 256, 2 + 2 + 12 + 128}, kQ5_K{"Q5_K", 256, 2 + 2 + 12 + 32 + 128},
      kQ6_K{"Q6_K", 256, 128 + 64 + 16 + 2};
  switch (t) {
    case TensorType::F32: return &kF32;
    case TensorType::F16: return &kF16;
    case TensorType::BF16: return &kBF16;
    case TensorType::Q4_0: return &kQ4_0;
    case TensorType::Q4_1: return &kQ4_1;
    case TensorType::Q5_0: return &kQ5_0;
    case TensorType::Q8_0: return &kQ8_0;
    case TensorType::Q4_K: return &kQ4_K;
    case TensorType::Q5_K: return &kQ5_K;
    case TensorType::Q6_K: return &kQ6_K;
  }
  return nullptr;
}

const Layout& require(TensorType t) {
  const Layout* l = layout(t);
  if (l == nullptr) throw Error("GGUF: unsupported tensor type " + type_name(t));
  return *l;
}

}  // namespace

bool is_supported(TensorType t) { return layout(t) != nullptr; }

std::string type_name(TensorType t) {
  const Layout* l = layout(t);
  return l ? l->name : "type#" + std::to_string(static_cast<uint32_t>(t));
}

size_t block_elements(TensorType t) { return require(t).elements; }
size_t block_bytes(TensorType t) { return require(t).bytes; }

size_t row_bytes(TensorType t, uint64_t n) {
  const Layout& l = require(t);
  if (n % l.elements != 0) {
    throw Error("GGUF: " + std::to_string(n) + " elements is not a multiple of the " + l.name +
                " block size " + std::to_string(l.elements));
  }
  size_t bytes = 0;
  if (__builtin_mul_overflow(n / l.elements, l.bytes, &bytes)) {
    throw Error("GGUF: row of " + std::to_string(n) + " " + l.name + " elements overflows size_t");
  }
  return bytes;
}

}  // namespace activekv::gguf
