// lossless13 encoder, validating parser and decoder (SPEC §3.2; layout in
// codec_lossless13.h).
#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "activekv/core/error.h"
#include "activekv/kv/codec_lossless13.h"
#include "internal.h"

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

// A validated plane: mode, table and where its data starts.
struct PlaneView {
  Lossless13Mode mode = Lossless13Mode::raw;
  std::array<uint8_t, kMaxExponents> table{};
  int n_exp = 0;
  const std::byte* data = nullptr;
};

// Validates the directory and every plane of a lossless13 page.
std::vector<PlaneView> parse(const EncodedPage& page, PageHeader& header) {
  using detail::load;
  header = detail::expect_format(page.bytes, CodecFormat::lossless13);
  const int n_planes = 2 * header.n_kv_heads;
  const size_t n = size_t(header.n_tokens) * size_t(header.head_dim);
  const std::byte* payload = page.bytes.data() + kCodecHeaderBytes;
  const size_t size = header.payload_bytes;
  const size_t dir_bytes = 4 * size_t(n_planes);
  if (size < dir_bytes) {
    throw Error(fmt::format("lossless13 page: payload of {} bytes cannot hold the {}-byte plane directory", size,
                            dir_bytes));
  }
  std::vector<PlaneView> planes(static_cast<size_t>(n_planes));
  size_t pos = dir_bytes;
  for (int p = 0; p < n_planes; ++p) {
    const uint32_t off = load<uint32_t>(payload + 4 * size_t(p));
    if (off != pos) {
      throw Error(fmt::format("lossless13 page: plane {} offset {} does not follow the previous plane (expected {})",
                              p, off, pos));
    }
    if (size - pos < 2) throw Error(fmt::format("lossless13 page: plane {} header runs past the payload", p));
    const uint8_t mode = uint8_t(payload[pos]), n_exp = uint8_t(payload[pos + 1]);
    PlaneView& v = planes[size_t(p)];
    if (mode == uint8_t(Lossless13Mode::raw)) {
      if (n_exp != 0) throw Error(fmt::format("lossless13 page: raw plane {} has table size {} (must be 0)", p, n_exp));
      if (size - pos - 2 < 2 * n) throw Error(fmt::format("lossless13 page: raw plane {} runs past the payload", p));
      v.mode = Lossless13Mode::raw;
      v.data = payload + pos + 2;
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
    v.mode = Lossless13Mode::table;
    v.n_exp = n_exp;
    for (int i = 0; i < n_exp; ++i) {
      v.table[size_t(i)] = uint8_t(payload[pos + 2 + size_t(i)]);
      if (i > 0 && v.table[size_t(i)] <= v.table[size_t(i) - 1]) {
        throw Error(fmt::format("lossless13 page: plane {} exponent table is not strictly ascending at entry {}", p, i));
      }
    }
    v.data = payload + pos + 2 + n_exp;
    // Every index must address the table; unused bits of the last byte must be zero.
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(v.data);
    for (size_t i = 0; i < n; ++i) {
      const size_t bit = 13 * i;
      const uint32_t w = uint32_t(bytes[bit / 8]) | (uint32_t(bytes[bit / 8 + 1]) << 8) |
                         (bit / 8 + 2 < packed_bytes(n) ? uint32_t(bytes[bit / 8 + 2]) << 16 : 0u);
      const uint32_t idx = ((w >> (bit % 8)) >> 7) & 0x1fu;
      if (idx >= n_exp) {
        throw Error(fmt::format("lossless13 page: plane {} value {} has table index {} >= table size {}", p, i, idx,
                                n_exp));
      }
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
  return planes;
}

void decode_plane(const PlaneView& v, size_t n, bf16* out) {
  if (v.mode == Lossless13Mode::raw) {
    std::memcpy(out, v.data, 2 * n);
    return;
  }
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(v.data);
  uint64_t acc = 0;
  int bits = 0;
  size_t r = 0;
  for (size_t i = 0; i < n; ++i) {
    while (bits < 13) {
      acc |= uint64_t(bytes[r++]) << bits;
      bits += 8;
    }
    const uint32_t code = uint32_t(acc & 0x1fffu);
    acc >>= 13;
    bits -= 13;
    out[i].bits = uint16_t(((code >> 12) << 15) | (uint32_t(v.table[(code >> 7) & 0x1fu]) << 7) | (code & 0x7fu));
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

void decode_lossless13_page(const EncodedPage& page, std::span<bf16> out) {
  PageHeader h;
  const std::vector<PlaneView> planes = parse(page, h);
  const size_t plane = size_t(h.page_size) * h.head_dim, n = size_t(h.n_tokens) * h.head_dim;
  if (out.size() < planes.size() * plane) {
    throw InvalidArgument(fmt::format("lossless13 decode: output holds {} values, the page needs {}", out.size(),
                                      planes.size() * plane));
  }
  for (size_t p = 0; p < planes.size(); ++p) {
    decode_plane(planes[p], n, out.data() + p * plane);
    std::fill(out.data() + p * plane + n, out.data() + (p + 1) * plane, bf16{});
  }
}

std::vector<Lossless13Mode> lossless13_plane_modes(const EncodedPage& page) {
  PageHeader h;
  std::vector<Lossless13Mode> modes;
  for (const PlaneView& v : parse(page, h)) modes.push_back(v.mode);
  return modes;
}

}  // namespace activekv::kv
