// Format-independent entry points: dispatch, fp32 decoding, sizes.
#include <fmt/format.h>

#include <algorithm>

#include "activekv/core/error.h"
#include "activekv/kv/codec.h"
#include "activekv/kv/codec_int8s.h"
#include "activekv/kv/codec_lossless13.h"
#include "internal.h"

namespace activekv::kv {

EncodedPage encode_page(CodecFormat f, const KvShape& shape, std::span<const bf16> page, int n_tokens) {
  switch (f) {
    case CodecFormat::lossless13: return encode_lossless13_page(shape, page, n_tokens);
    case CodecFormat::int8s: return encode_int8s_page(shape, page, n_tokens);
  }
  throw InvalidArgument(fmt::format("encode_page: unknown format id {}", unsigned(f)));
}

EncodedPage encode_page(CodecFormat f, const PageStore& store, PageId id, int n_tokens) {
  const KvShape& s = store.shape();
  if (s.format != PageFormat::bf16) {
    throw InvalidArgument(fmt::format("encode_page: store format is {}, codecs encode bf16 pages",
                                      format_name(s.format)));
  }
  // k_plane(id, 0) is the start of the page: K planes then V planes, contiguous.
  const auto* base = reinterpret_cast<const bf16*>(store.k_plane(id, 0));
  return encode_page(f, s, std::span<const bf16>(base, s.page_elements()), n_tokens);
}

PageHeader validate_page(std::span<const std::byte> blob) {
  const PageHeader h = read_header(blob);
  if (h.format == CodecFormat::lossless13) return parse_lossless13_page(blob).header;
  return parse_int8s_page(blob).header;
}

void decode_page_f32(const EncodedPage& page, std::span<float> out) {
  const PageHeader h = read_header(page.bytes);
  const size_t plane = size_t(h.page_size) * h.head_dim;
  const size_t total = 2 * size_t(h.n_kv_heads) * plane;
  if (out.size() < total) {
    throw InvalidArgument(fmt::format("decode_page_f32: output holds {} values, the page needs {}", out.size(), total));
  }
  std::fill(out.begin(), out.begin() + ptrdiff_t(total), 0.0f);
  const size_t n = size_t(h.n_tokens) * h.head_dim;
  if (h.format == CodecFormat::lossless13) {
    const Lossless13PageView view = parse_lossless13_page(page.bytes);
    for (int p = 0; p < view.n_planes(); ++p) view.decode_plane(p, n, out.data() + size_t(p) * plane);
    return;
  }
  const Int8sPageView view = parse_int8s_page(page);
  const int d = h.head_dim, n_tok = h.n_tokens, H = h.n_kv_heads;
  for (int g = 0; g < H; ++g) {
    const Int8sHeadView hv = view.head(g);
    float* k = out.data() + size_t(g) * plane;
    float* v = out.data() + size_t(H + g) * plane;
    for (int t = 0; t < n_tok; ++t) {
      for (int j = 0; j < d; ++j) {
        const size_t i = size_t(t) * d + j;
        k[i] = float(double(hv.c(size_t(j))) * double(hv.s(size_t(t))) * double(hv.kq[i]));
        v[i] = float(double(hv.v(size_t(j))) * double(hv.vq[i]));
      }
    }
  }
}

size_t encoded_page_bytes(CodecFormat f, const KvShape& shape) {
  if (f == CodecFormat::int8s) {
    return kCodecHeaderBytes + int8s_payload_bytes(shape.n_kv_heads, shape.head_dim, shape.page_size);
  }
  // Table path with a full 32-entry table in every plane (the largest table-path size).
  const size_t planes = 2 * size_t(shape.n_kv_heads);
  return kCodecHeaderBytes + 4 * planes +
         planes * lossless13_plane_bytes(Lossless13Mode::table, shape.plane_elements(), 32);
}

double bytes_per_token(CodecFormat f, const KvShape& shape) {
  if (shape.page_size <= 0) throw InvalidArgument("bytes_per_token: page_size must be positive");
  return double(encoded_page_bytes(f, shape)) / double(shape.page_size);
}

}  // namespace activekv::kv
