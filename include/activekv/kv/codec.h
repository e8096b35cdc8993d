// Compressed page codecs (SPEC §3.2 lossless13, §3.3 int8s): the encoded-page
// blob, its header, validation, and format-independent entry points.
//
// An EncodedPage holds one whole page of one layer (every KV head, K and V,
// the first `n_tokens` tokens) in one compressed format. It is a byte blob:
//
//   offset  size  field
//        0     4  magic "AKVC" (0x43564B41 little-endian)
//        4     2  format id (CodecFormat: 1 = lossless13, 2 = int8s)
//        6     2  format version (kCodecVersion = 1)
//        8     4  page_size    (tokens a full page holds)
//       12     4  n_kv_heads
//       16     4  head_dim
//       20     4  n_tokens     (valid tokens stored, 1..page_size)
//       24     8  payload_bytes (bytes after the 64-byte header)
//       32     8  checksum: FNV-1a 64 over bytes [0,32) and [40, end)
//       40    24  reserved, zero
//       64     -  payload (format specific, see codec_lossless13.h, codec_int8s.h)
//
// All integers little-endian. Every reader validates the header (magic,
// format, version, dimension limits, payload size against the blob size and
// against the size the format implies), then the checksum, then the format
// metadata (scales, table indexes) before reading any value; any failure
// throws activekv::Error naming the field. See docs/formats.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "activekv/core/bf16.h"
#include "activekv/kv/page_store.h"

namespace activekv::kv {

/// Compressed page formats. Values are the on-disk format ids.
enum class CodecFormat : uint16_t { lossless13 = 1, int8s = 2 };

inline constexpr uint32_t kCodecMagic = 0x43564B41u;  ///< "AKVC"
inline constexpr uint16_t kCodecVersion = 1;
inline constexpr size_t kCodecHeaderBytes = 64;
/// Dimension limits a header must respect (guards size arithmetic).
inline constexpr uint32_t kMaxPageSize = 1u << 20;
inline constexpr uint32_t kMaxKvHeads = 1024;
inline constexpr uint32_t kMaxHeadDim = 1024;

/// One compressed page: header + payload, see the file comment.
struct EncodedPage {
  std::vector<std::byte> bytes;
};

/// The validated header fields of an encoded page.
struct PageHeader {
  CodecFormat format = CodecFormat::int8s;
  uint16_t version = kCodecVersion;
  int page_size = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int n_tokens = 0;
  uint64_t payload_bytes = 0;
  uint64_t checksum = 0;
};

/// "lossless13" / "int8s".
std::string codec_name(CodecFormat f);
/// Parses a name; throws InvalidArgument naming the accepted values.
CodecFormat parse_codec_format(const std::string& name);

/// Reads and validates the header and the checksum of `blob` (not the format
/// metadata: the format parsers do that). Throws Error naming the bad field:
/// blob shorter than the header, magic, format id, version, a dimension out
/// of range, n_tokens > page_size, payload size != blob size - 64, reserved
/// bytes not zero, checksum mismatch.
PageHeader read_header(std::span<const std::byte> blob);

/// Validates a blob completely, whatever its format: header, checksum and
/// the format metadata (what parse_int8s_page / parse_lossless13_page
/// check). This is the one validation a page gets when it is published;
/// readers of the published page's view check nothing. Returns the header;
/// throws Error naming the problem.
PageHeader validate_page(std::span<const std::byte> blob);

/// Encodes the first `n_tokens` tokens of a bf16 page. `page` holds
/// shape.page_elements() bf16 values in the PageStore layout
/// (K planes [n_kv_heads][page_size][head_dim], then V planes). int8s uses the
/// SPEC key scaling (channel + token scales). Throws InvalidArgument for a
/// bad shape, n_tokens outside [1, page_size], a short span, or (int8s) a
/// non-finite input or a scale that overflows fp16.
EncodedPage encode_page(CodecFormat f, const KvShape& shape, std::span<const bf16> page, int n_tokens);
/// Same, reading page `id` of a bf16 PageStore.
EncodedPage encode_page(CodecFormat f, const PageStore& store, PageId id, int n_tokens);

/// Decodes any format to fp32 values in the PageStore layout: `out` must hold
/// page_size * n_kv_heads * head_dim * 2 floats; tokens >= n_tokens are set to 0.
/// lossless13 gives the original bf16 values widened exactly; int8s gives the
/// dequantised values c_j * s_t * q (keys) and v_j * q (values), computed in
/// double from the stored fp16 scales and rounded once to fp32.
/// Throws Error if the blob does not validate (nothing is read then).
void decode_page_f32(const EncodedPage& page, std::span<float> out);

/// Exact size in bytes of the blob for a full page of `shape` (n_tokens =
/// page_size). lossless13 assumes every plane takes the table path (the
/// raw-fallback size is given by lossless13_raw_page_bytes).
size_t encoded_page_bytes(CodecFormat f, const KvShape& shape);
/// Bytes per token per layer of a full page: encoded_page_bytes / page_size
/// (header and per-page metadata amortised). Compare with
/// shape.bytes_per_token_per_layer() for bf16.
double bytes_per_token(CodecFormat f, const KvShape& shape);

/// Recomputes and stores the checksum after a deliberate edit of the blob
/// (tests and tools that craft pages). Throws Error if the blob is shorter
/// than the header.
void rewrite_checksum(EncodedPage& page);

}  // namespace activekv::kv
