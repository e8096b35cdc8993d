// Encoded-page header: writing, reading, validation and the checksum.
#include <fmt/format.h>

#include "activekv/core/error.h"
#include "internal.h"

namespace activekv::kv {

std::string codec_name(CodecFormat f) {
  switch (f) {
    case CodecFormat::lossless13: return "lossless13";
    case CodecFormat::int8s: return "int8s";
  }
  return fmt::format("codec#{}", unsigned(f));
}

CodecFormat parse_codec_format(const std::string& name) {
  if (name == "lossless13") return CodecFormat::lossless13;
  if (name == "int8s") return CodecFormat::int8s;
  throw InvalidArgument(fmt::format("unknown codec format '{}' (expected lossless13 or int8s)", name));
}

PageHeader read_header(std::span<const std::byte> blob) {
  using detail::load;
  if (blob.size() < kCodecHeaderBytes) {
    throw Error(fmt::format("encoded page: blob of {} bytes is shorter than the {}-byte header",
                            blob.size(), kCodecHeaderBytes));
  }
  const std::byte* p = blob.data();
  const uint32_t magic = load<uint32_t>(p);
  if (magic != kCodecMagic) throw Error(fmt::format("encoded page: bad magic 0x{:08x}", magic));
  const uint16_t format = load<uint16_t>(p + 4);
  if (format != uint16_t(CodecFormat::lossless13) && format != uint16_t(CodecFormat::int8s)) {
    throw Error(fmt::format("encoded page: unknown format id {}", format));
  }
  const uint16_t version = load<uint16_t>(p + 6);
  if (version != kCodecVersion) {
    throw Error(fmt::format("encoded page: unsupported format version {} (expected {})", version,
                            kCodecVersion));
  }
  const uint32_t page_size = load<uint32_t>(p + 8), heads = load<uint32_t>(p + 12),
                 dim = load<uint32_t>(p + 16), n_tokens = load<uint32_t>(p + 20);
  if (page_size == 0 || page_size > kMaxPageSize) {
    throw Error(fmt::format("encoded page: page_size {} outside [1, {}]", page_size, kMaxPageSize));
  }
  if (heads == 0 || heads > kMaxKvHeads) {
    throw Error(fmt::format("encoded page: n_kv_heads {} outside [1, {}]", heads, kMaxKvHeads));
  }
  if (dim == 0 || dim > kMaxHeadDim) {
    throw Error(fmt::format("encoded page: head_dim {} outside [1, {}]", dim, kMaxHeadDim));
  }
  if (n_tokens == 0 || n_tokens > page_size) {
    throw Error(fmt::format("encoded page: n_tokens {} outside [1, page_size {}]", n_tokens, page_size));
  }
  const uint64_t payload = load<uint64_t>(p + 24);
  if (payload != blob.size() - kCodecHeaderBytes) {
    throw Error(fmt::format("encoded page: header says {} payload bytes, blob has {}", payload,
                            blob.size() - kCodecHeaderBytes));
  }
  for (size_t i = 40; i < kCodecHeaderBytes; ++i) {
    if (p[i] != std::byte{0}) throw Error(fmt::format("encoded page: reserved header byte {} is not zero", i));
  }
  const uint64_t stored = load<uint64_t>(p + 32);
  const uint64_t actual = detail::blob_checksum(blob);
  if (stored != actual) {
    throw Error(fmt::format("encoded page: checksum mismatch (stored 0x{:016x}, computed 0x{:016x})",
                            stored, actual));
  }
  PageHeader h;
  h.format = CodecFormat(format);
  h.version = version;
  h.page_size = int(page_size);
  h.n_kv_heads = int(heads);
  h.head_dim = int(dim);
  h.n_tokens = int(n_tokens);
  h.payload_bytes = payload;
  h.checksum = stored;
  return h;
}

void rewrite_checksum(EncodedPage& page) {
  if (page.bytes.size() < kCodecHeaderBytes) {
    throw Error(fmt::format("encoded page: blob of {} bytes is shorter than the header", page.bytes.size()));
  }
  detail::store<uint64_t>(page.bytes.data() + 32, detail::blob_checksum(page.bytes));
}

namespace detail {

EncodedPage start_blob(CodecFormat f, const KvShape& shape, int n_tokens, size_t payload_bytes) {
  EncodedPage page;
  page.bytes.assign(kCodecHeaderBytes + payload_bytes, std::byte{0});
  std::byte* p = page.bytes.data();
  store<uint32_t>(p, kCodecMagic);
  store<uint16_t>(p + 4, uint16_t(f));
  store<uint16_t>(p + 6, kCodecVersion);
  store<uint32_t>(p + 8, uint32_t(shape.page_size));
  store<uint32_t>(p + 12, uint32_t(shape.n_kv_heads));
  store<uint32_t>(p + 16, uint32_t(shape.head_dim));
  store<uint32_t>(p + 20, uint32_t(n_tokens));
  store<uint64_t>(p + 24, uint64_t(payload_bytes));
  return page;
}

void finish_blob(EncodedPage& page) { rewrite_checksum(page); }

void check_encode_args(const char* what, const KvShape& shape, std::span<const bf16> page, int n_tokens) {
  if (shape.page_size <= 0 || uint32_t(shape.page_size) > kMaxPageSize || shape.n_kv_heads <= 0 ||
      uint32_t(shape.n_kv_heads) > kMaxKvHeads || shape.head_dim <= 0 ||
      uint32_t(shape.head_dim) > kMaxHeadDim) {
    throw InvalidArgument(fmt::format("{}: shape page_size={} n_kv_heads={} head_dim={} out of range", what,
                                      shape.page_size, shape.n_kv_heads, shape.head_dim));
  }
  if (n_tokens < 1 || n_tokens > shape.page_size) {
    throw InvalidArgument(
        fmt::format("{}: n_tokens {} outside [1, page_size {}]", what, n_tokens, shape.page_size));
  }
  if (page.size() < shape.page_elements()) {
    throw InvalidArgument(
        fmt::format("{}: page span holds {} values, the shape needs {}", what, page.size(), shape.page_elements()));
  }
}

PageHeader expect_format(std::span<const std::byte> blob, CodecFormat f) {
  const PageHeader h = read_header(blob);
  if (h.format != f) {
    throw Error(fmt::format("encoded page: format is {}, expected {}", codec_name(h.format), codec_name(f)));
  }
  return h;
}

}  // namespace detail
}  // namespace activekv::kv
