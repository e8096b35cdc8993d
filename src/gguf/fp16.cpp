// Public wrapper of the inline binary16 conversion (see fp16.h).
#include "fp16.h"

#include "activekv/gguf/tensor_type.h"

namespace activekv::gguf {

float f16_to_f32(uint16_t bits) { return detail::half_to_float(bits); }

}  // namespace activekv::gguf
