// lossless13 encoder, validating parser and decoder (SPEC §3.2; layout in
// codec_lossless13.h).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <type_traits>

#include "activekv/core/error.h"
#include "activekv/kv/codec_lossless13.h"
#include "internal.h"
#include "unpack13.h"

namespace activekv::kv {
namespace {

constexpr int kMaxExponents = 32;

size_t packed_bytes(size_t n) { return (n * 13 + 7) / 8; }

// Distinct exponent fields of a plane, ascending; more than 32 -> empty.
std::vector<uint8_t> exponent_table(const bf16* x, size_t n) {
  std::array<bool, 256> seen{};
  int count = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t e = uint8_t((x[i].bits >> 7) & 0xffu);
    if (!seen[e]) {
      seen[e] = true;
      if (++count > kMaxExponents) return {};
    }
  }
  std::vector<uint8_t> table;
  for (int e = 0; e < 256; ++e) {
    if (seen[size_t(e)]) table.push_back(uint8_t(e));
  }
  return table;
}

// Writes one plane at `out`; returns bytes written. `table` empty = raw.
size_t encode_plane(const bf16* x, size_t n, const std::vector<uint8_t>& table, std::byte* out) {
  if (table.empty()) {
    out[0] = std::byte(Lossless13Mode::raw);
    out[1] = std::byte{0};
    std::memcpy(out + 2, x, 2 * n);
    return 2 + 2 * n;
  }
  out[0] = std::byte(Lossless13Mode::table);
  out[1] = std::byte(table.size());
  std::memcpy(out + 2, table.data(), table.size());
  std::array<uint8_t, 256> index{};
  for (size_t i = 0; i < table.size(); ++i) index[table[i]] = uint8_t(i);
  std::byte* dst = out + 2 + table.size();
  uint64_t acc = 0;
  int bits = 0;
  size_t w = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint16_t b = x[i].bits;
    const uint32_t code = (uint32_t(b >> 15) << 12) | (uint32_t(index[(b >> 7) & 0xffu]) << 7) | (b & 0x7fu);
    acc |= uint64_t(code) << bits;
    bits += 13;
    while (bits >= 8) {
      dst[w++] = std::byte(acc & 0xffu);
      acc >>= 8;
      bits -= 8;
    }
  }
  if (bits > 0) dst[w++] = std::byte(acc & 0xffu);
  return 2 + table.size() + w;
}

// Validates the directory and every plane of a lossless13 page.
void validate_planes(std::span<const std::byte> blob, const PageHeader& header) {
  using detail::load;
  const int n_planes = 2 * header.n_kv_heads;
  const size_t n = size_t(header.n_tokens) * size_t(header.head_dim);
  const std::byte* payload = blob.data() + kCodecHeaderBytes;
  const size_t size = header.payload_bytes;
  const size_t dir_bytes = 4 * size_t(n_planes);
  if (size < dir_bytes) {
    throw Error(fmt::format("lossless13 page: payload of {} bytes cannot hold the {}-byte plane directory", size,
                            dir_bytes));
  }
  size_t pos = dir_bytes;
  for (int p = 0; p < n_planes; ++p) {
    const uint32_t off = load<uint32_t>(payload + 4 * size_t(p));
    if (off != pos) {
      throw Error(fmt::format("lossless13 page: plane {} offset {} does not follow the previous plane (expected {})",
                              p, off, pos));
    }
    if (size - pos < 2) throw Error(fmt::format("lossless13 page: plane {} header runs past the payload", p));
    const uint8_t mode = uint8_t(payload[pos]), n_exp = uint8_t(payload[pos + 1]);
    if (mode == uint8_t(Lossless13Mode::raw)) {
      if (n_exp != 0) throw Error(fmt::format("lossless13 page: raw plane {} has table size {} (must be 0)", p, n_exp));
      if (size - pos - 2 < 2 * n) throw Error(fmt::format("lossless13 page: raw plane {} runs past the payload", p));
      pos += 2 + 2 * n;
      continue;
    }
    if (mode != uint8_t(Lossless13Mode::table)) {
      throw Error(fmt::format("lossless13 page: plane {} has unknown mode {}", p, mode));
    }
    if (n_exp < 1 || n_exp > kMaxExponents) {
      throw Error(fmt::format("lossless13 page: plane {} table size {} outside [1, {}]", p, n_exp, kMaxExponents));
    }
    if (size - pos - 2 < n_exp + packed_bytes(n)) {
      throw Error(fmt::format("lossless13 page: table plane {} runs past the payload", p));
    }
    const uint8_t* table = reinterpret_cast<const uint8_t*>(payload + pos + 2);
    for (int i = 1; i < n_exp; ++i) {
      if (table[i] <= table[i - 1]) {
        throw Error(fmt::format("lossless13 page: plane {} exponent table is not strictly ascending at entry {}", p, i));
      }
    }
    // Every index must address the table; unused bits of the last byte must be zero.
    const uint8_t* bytes = table + n_exp;
    const size_t bad = detail::first_index_at_least(bytes, n, n_exp);
    if (bad < n) {
      const size_t bit = 13 * bad;
      const uint32_t w = uint32_t(bytes[bit / 8]) | (uint32_t(bytes[bit / 8 + 1]) << 8) |
                         (bit / 8 + 2 < packed_bytes(n) ? uint32_t(bytes[bit / 8 + 2]) << 16 : 0u);
      throw Error(fmt::format("lossless13 page: plane {} value {} has table index {} >= table size {}", p, bad,
                              ((w >> (bit % 8)) >> 7) & 0x1fu, n_exp));
    }
    const size_t used_bits = 13 * n, total_bits = 8 * packed_bytes(n);
    if (used_bits < total_bits && (uint32_t(bytes[packed_bytes(n) - 1]) >> (8 - (total_bits - used_bits))) != 0) {
      throw Error(fmt::format("lossless13 page: plane {} has non-zero padding bits", p));
    }
    pos += 2 + n_exp + packed_bytes(n);
  }
  if (pos != size) {
    throw Error(fmt::format("lossless13 page: planes end at byte {} of a {}-byte payload", pos, size));
  }
}

// Where plane p of a validated page starts: its mode byte.
const std::byte* plane_start(const Lossless13PageView& v, int p) {
  const std::byte* payload = v.blob.data() + kCodecHeaderBytes;
  return payload + detail::load<uint32_t>(payload + 4 * size_t(p));
}

template <class Out>
void decode_plane_as(const Lossless13PageView& v, int p, size_t n, Out* out) {
  const std::byte* start = plane_start(v, p);
  const uint8_t n_exp = uint8_t(start[1]);
  if (Lossless13Mode(start[0]) == Lossless13Mode::raw) {
    if constexpr (std::is_same_v<Out, bf16>) {
      std::memcpy(out, start + 2, 2 * n);
    } else {
      for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(bf16{detail::load<uint16_t>(start + 2 + 2 * i)});
    }
    return;
  }
  uint8_t table[kMaxExponents] = {};
  std::memcpy(table, start + 2, n_exp);
  const auto* codes = reinterpret_cast<const uint8_t*>(start + 2 + n_exp);
  if constexpr (std::is_same_v<Out, bf16>) {
    static_assert(sizeof(bf16) == sizeof(uint16_t));
    detail::unpack13(codes, n, table, reinterpret_cast<uint16_t*>(out));
  } else {
    detail::unpack13(codes, n, table, out);
  }
}

}  // namespace

size_t lossless13_plane_bytes(Lossless13Mode mode, size_t n_values, int n_exp) {
  return mode == Lossless13Mode::raw ? 2 + 2 * n_values : 2 + size_t(n_exp) + packed_bytes(n_values);
}

size_t lossless13_raw_page_bytes(const KvShape& shape) {
  const size_t planes = 2 * size_t(shape.n_kv_heads);
  return kCodecHeaderBytes + 4 * planes +
         planes * lossless13_plane_bytes(Lossless13Mode::raw, shape.plane_elements(), 0);
}

EncodedPage encode_lossless13_page(const KvShape& shape, std::span<const bf16> page, int n_tokens) {
  detail::check_encode_args("lossless13 encode", shape, page, n_tokens);
  const int n_planes = 2 * shape.n_kv_heads;
  const size_t n = size_t(n_tokens) * shape.head_dim;
  std::vector<std::vector<uint8_t>> tables(static_cast<size_t>(n_planes));
  size_t payload = 4 * size_t(n_planes);
  for (int p = 0; p < n_planes; ++p) {
    tables[size_t(p)] = exponent_table(page.data() + size_t(p) * shape.plane_elements(), n);
    payload += tables[size_t(p)].empty()
                   ? lossless13_plane_bytes(Lossless13Mode::raw, n, 0)
                   : lossless13_plane_bytes(Lossless13Mode::table, n, int(tables[size_t(p)].size()));
  }
  EncodedPage out = detail::start_blob(CodecFormat::lossless13, shape, n_tokens, payload);
  std::byte* base = out.bytes.data() + kCodecHeaderBytes;
  size_t pos = 4 * size_t(n_planes);
  for (int p = 0; p < n_planes; ++p) {
    detail::store<uint32_t>(base + 4 * size_t(p), uint32_t(pos));
    pos += encode_plane(page.data() + size_t(p) * shape.plane_elements(), n, tables[size_t(p)], base + pos);
  }
  detail::finish_blob(out);
  return out;
}

Lossless13Mode Lossless13PageView::mode(int p) const { return Lossless13Mode(plane_start(*this, p)[0]); }

void Lossless13PageView::decode_plane(int p, size_t n, bf16* out) const { decode_plane_as(*this, p, n, out); }
void Lossless13PageView::decode_plane(int p, size_t n, float* out) const { decode_plane_as(*this, p, n, out); }

Lossless13PageView parse_lossless13_page(std::span<const std::byte> blob) {
  Lossless13PageView view;
  view.header = detail::expect_format(blob, CodecFormat::lossless13);
  validate_planes(blob, view.header);
  view.blob = blob;
  return view;
}

void decode_lossless13_page(const Lossless13PageView& page, std::span<bf16> out) {
  const PageHeader& h = page.header;
  const size_t plane = size_t(h.page_size) * h.head_dim, n = size_t(h.n_tokens) * h.head_dim;
  const size_t n_planes = size_t(page.n_planes());
  if (out.size() < n_planes * plane) {
    throw InvalidArgument(fmt::format("lossless13 decode: output holds {} values, the page needs {}", out.size(),
                                      n_planes * plane));
  }
  for (size_t p = 0; p < n_planes; ++p) {
    page.decode_plane(int(p), n, out.data() + p * plane);
    std::fill(out.data() + p * plane + n, out.data() + (p + 1) * plane, bf16{});
  }
}

void decode_lossless13_page(const EncodedPage& page, std::span<bf16> out) {
  decode_lossless13_page(parse_lossless13_page(page.bytes), out);
}

std::vector<Lossless13Mode> lossless13_plane_modes(const EncodedPage& page) {
  const Lossless13PageView view = parse_lossless13_page(page.bytes);
  std::vector<Lossless13Mode> modes;
  for (int p = 0; p < view.n_planes(); ++p) modes.push_back(view.mode(p));
  return modes;
}

}  // namespace activekv::kv
