// Element formats that pages are written in, and their fp32 conversions.
//
//   bf16  the exact tier of SPEC §3.1 (default): 2 bytes per value, fp32
//         rounded to nearest even. Compressed tiers are converted from it.
//   f32   a reference format: 4 bytes per value, no rounding at all. It lets
//         the forward pass be checked against independent fp32
//         implementations: a bf16 history adds rounding that later layers
//         amplify (a value near a bf16 rounding boundary flips by one bf16
//         ulp when an upstream fp32 result changes in its last bit).
#pragma once

#include <cstddef>
#include <string>

namespace activekv::kv {

enum class PageFormat { bf16, f32 };

/// Bytes per stored value.
size_t element_bytes(PageFormat f);
/// "bf16" / "f32".
std::string format_name(PageFormat f);
/// Parses a name; throws InvalidArgument naming the accepted values.
PageFormat parse_page_format(const std::string& name);

/// Stores n fp32 values at element index `first` of `plane` in format f.
void encode_elements(PageFormat f, const float* src, size_t n, std::byte* plane, size_t first);
/// Widens n stored values starting at element 0 of `plane` to fp32.
void decode_elements(PageFormat f, const std::byte* plane, size_t n, float* dst);

}  // namespace activekv::kv
