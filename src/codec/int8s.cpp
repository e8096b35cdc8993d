// int8s encoder and validating parser (SPEC §3.3; layout in codec_int8s.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "activekv/core/error.h"
#include "activekv/kv/codec_int8s.h"
#include "internal.h"

namespace activekv::kv {
namespace {

constexpr double kMinChannelScale = 0x1p-14;
constexpr double kMaxChannelScale = 0x1p14;

int8_t quantise(double x, double scale) {
  if (scale == 0.0) return 0;
  const double r = std::nearbyint(x / scale);  // round half to even (default rounding mode)
  return int8_t(std::clamp(r, -127.0, 127.0));
}

uint16_t scale_to_half(double s, const char* what, int head, int index) {
  const uint16_t h = detail::double_to_half(s);
  if ((h & 0x7c00u) == 0x7c00u) {
    throw InvalidArgument(fmt::format("int8s encode: {} scale {} of head {} ({}) overflows fp16", what, index,
                                      head, s));
  }
  return h;
}

void check_finite(const bf16* x, size_t n, const char* plane, int head) {
  for (size_t i = 0; i < n; ++i) {
    if ((x[i].bits & 0x7f80u) == 0x7f80u) {
      throw InvalidArgument(fmt::format("int8s encode: {} plane of head {} holds a non-finite value at element {}",
                                        plane, head, i));
    }
  }
}

// Encodes one head's keys into its section: c[d], s[n], codes[n][d].
void encode_keys(const bf16* k, int n, int d, int head, Int8sKeyScaling scaling, std::byte* section) {
  std::vector<double> c(size_t(d), 1.0);
  if (scaling == Int8sKeyScaling::separable) {
    double log_sum = 0;
    int n_nonzero = 0;
    for (int j = 0; j < d; ++j) {
      double sq = 0;
      for (int t = 0; t < n; ++t) {
        const double x = bf16_to_f32(k[size_t(t) * d + j]);
        sq += x * x;
      }
      const double r = std::sqrt(sq / n);
      c[size_t(j)] = std::sqrt(r);
      if (c[size_t(j)] > 0) {
        log_sum += std::log(c[size_t(j)]);
        ++n_nonzero;
      }
    }
    const double g = n_nonzero > 0 ? std::exp(log_sum / n_nonzero) : 1.0;
    for (double& cj : c) cj = cj > 0 ? std::clamp(cj / g, kMinChannelScale, kMaxChannelScale) : 1.0;
  }
  const Int8sSectionLayout lay{size_t(d), size_t(n)};
  std::byte* c_out = section + lay.key_channel_scales();
  std::byte* s_out = section + lay.key_token_scales();
  auto* codes = reinterpret_cast<int8_t*>(section + lay.key_codes());
  std::vector<double> c_stored(static_cast<size_t>(d));
  for (int j = 0; j < d; ++j) {
    const uint16_t h = detail::double_to_half(c[size_t(j)]);  // in [2^-14, 2^14]: exact range of fp16 normals
    detail::store<uint16_t>(c_out + 2 * size_t(j), h);
    c_stored[size_t(j)] = detail::half_to_float(h);
  }
  for (int t = 0; t < n; ++t) {
    const bf16* row = k + size_t(t) * d;
    double m = 0;
    for (int j = 0; j < d; ++j) m = std::max(m, std::fabs(double(bf16_to_f32(row[j]))) / c_stored[size_t(j)]);
    const uint16_t sh = scale_to_half(m / 127.0, "key token", head, t);
    detail::store<uint16_t>(s_out + 2 * size_t(t), sh);
    const double s = detail::half_to_float(sh);
    for (int j = 0; j < d; ++j) {
      codes[size_t(t) * d + j] = quantise(bf16_to_f32(row[j]), c_stored[size_t(j)] * s);
    }
  }
}

// Encodes one head's values into its section: v[d], codes[n][d].
void encode_values(const bf16* v, int n, int d, int head, std::byte* section) {
  const Int8sSectionLayout lay{size_t(d), size_t(n)};
  std::byte* out = section + lay.value_channel_scales();
  auto* codes = reinterpret_cast<int8_t*>(section + lay.value_codes());
  for (int j = 0; j < d; ++j) {
    double m = 0;
    for (int t = 0; t < n; ++t) m = std::max(m, std::fabs(double(bf16_to_f32(v[size_t(t) * d + j]))));
    const uint16_t h = scale_to_half(m / 127.0, "value channel", head, j);
    detail::store<uint16_t>(out + 2 * size_t(j), h);
    const double vj = detail::half_to_float(h);
    for (int t = 0; t < n; ++t) codes[size_t(t) * d + j] = quantise(bf16_to_f32(v[size_t(t) * d + j]), vj);
  }
}

// Validates `count` fp16 scales at p (channel: also within [2^-14, 2^14]).
void check_scales(const std::byte* p, int count, const char* what, int head, bool channel) {
  for (int i = 0; i < count; ++i) {
    const float x = detail::half_to_float(detail::load<uint16_t>(p + 2 * size_t(i)));
    if (!std::isfinite(x)) throw Error(fmt::format("int8s page: {} scale {} of head {} is not finite", what, i, head));
    if (channel && (x < float(kMinChannelScale) || x > float(kMaxChannelScale))) {
      throw Error(fmt::format("int8s page: {} scale {} of head {} is {}, outside [2^-14, 2^14]", what, i, head, x));
    }
    if (x < 0.0f || std::signbit(x)) {
      throw Error(fmt::format("int8s page: {} scale {} of head {} is negative ({})", what, i, head, x));
    }
  }
}

void check_codes(const int8_t* q, size_t n, const char* what, int head) {
  for (size_t i = 0; i < n; ++i) {
    if (q[i] == -128) throw Error(fmt::format("int8s page: {} code {} of head {} is -128 (codes are in [-127, 127])",
                                              what, i, head));
  }
}

}  // namespace

size_t int8s_payload_bytes(int n_kv_heads, int head_dim, int n_tokens) {
  return Int8sSectionLayout{size_t(head_dim), size_t(n_tokens)}.payload_bytes(n_kv_heads);
}

EncodedPage encode_int8s_page(const KvShape& shape, std::span<const bf16> page, int n_tokens,
                              Int8sKeyScaling scaling) {
  detail::check_encode_args("int8s encode", shape, page, n_tokens);
  const int d = shape.head_dim, H = shape.n_kv_heads;
  const size_t plane = shape.plane_elements();
  for (int h = 0; h < H; ++h) {
    check_finite(page.data() + size_t(h) * plane, size_t(n_tokens) * d, "K", h);
    check_finite(page.data() + size_t(H + h) * plane, size_t(n_tokens) * d, "V", h);
  }
  EncodedPage out = detail::start_blob(CodecFormat::int8s, shape, n_tokens, int8s_payload_bytes(H, d, n_tokens));
  const Int8sSectionLayout lay{size_t(d), size_t(n_tokens)};
  for (int h = 0; h < H; ++h) {
    std::byte* section = out.bytes.data() + lay.head_offset(h);
    encode_keys(page.data() + size_t(h) * plane, n_tokens, d, h, scaling, section);
    encode_values(page.data() + size_t(H + h) * plane, n_tokens, d, h, section);
  }
  detail::finish_blob(out);
  return out;
}

Int8sHeadView Int8sPageView::head(int h) const {
  const Int8sSectionLayout lay{size_t(header.head_dim), size_t(header.n_tokens)};
  const std::byte* section = blob.data() + lay.head_offset(h);
  Int8sHeadView hv;
  hv.c_fp16 = section + lay.key_channel_scales();
  hv.s_fp16 = section + lay.key_token_scales();
  hv.kq = reinterpret_cast<const int8_t*>(section + lay.key_codes());
  hv.v_fp16 = section + lay.value_channel_scales();
  hv.vq = reinterpret_cast<const int8_t*>(section + lay.value_codes());
  return hv;
}

float Int8sHeadView::c(size_t j) const { return detail::half_to_float(detail::load<uint16_t>(c_fp16 + 2 * j)); }
float Int8sHeadView::s(size_t t) const { return detail::half_to_float(detail::load<uint16_t>(s_fp16 + 2 * t)); }
float Int8sHeadView::v(size_t j) const { return detail::half_to_float(detail::load<uint16_t>(v_fp16 + 2 * j)); }

void fp16_to_f32(const std::byte* src, size_t count, float* dst) {
  for (size_t i = 0; i < count; ++i) dst[i] = detail::half_to_float(detail::load<uint16_t>(src + 2 * i));
}

Int8sPageView parse_int8s_page(std::span<const std::byte> blob) {
  Int8sPageView view;
  view.header = detail::expect_format(blob, CodecFormat::int8s);
  view.blob = blob;
  const int d = view.header.head_dim, n = view.header.n_tokens, H = view.header.n_kv_heads;
  const size_t expected = int8s_payload_bytes(H, d, n);
  if (view.header.payload_bytes != expected) {
    throw Error(fmt::format("int8s page: payload is {} bytes, dimensions (heads {}, dim {}, tokens {}) need {}",
                            view.header.payload_bytes, H, d, n, expected));
  }
  for (int h = 0; h < H; ++h) {
    const Int8sHeadView hv = view.head(h);
    check_scales(hv.c_fp16, d, "key channel", h, true);
    check_scales(hv.s_fp16, n, "key token", h, false);
    check_codes(hv.kq, size_t(n) * d, "key", h);
    check_scales(hv.v_fp16, d, "value channel", h, false);
    check_codes(hv.vq, size_t(n) * d, "value", h);
  }
  return view;
}

Int8sPageView parse_int8s_page(const EncodedPage& page) {
  return parse_int8s_page(std::span<const std::byte>(page.bytes));
}

}  // namespace activekv::kv
