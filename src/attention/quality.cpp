// fp64 reference attention over stored/dequantised histories; own-format error.
#include "activekv/attention/quality.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "activekv/core/error.h"
#include "activekv/kv/codec_int8s.h"
#include "activekv/kv/codec_lossless13.h"

namespace activekv::attention {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

void check_dims(DenseHistoryF64& h, int heads, int dim) {
  if (h.n_kv_heads == 0 && h.head_dim == 0) {
    h.n_kv_heads = heads;
    h.head_dim = dim;
  }
  if (h.n_kv_heads != heads || h.head_dim != dim) {
    throw InvalidArgument(fmt::format("DenseHistoryF64: page of {} heads x {} dims appended to a history of {} x {}",
                                      heads, dim, h.n_kv_heads, h.head_dim));
  }
}

// Appends n tokens of every KV head to `h`. fill(g, k, v) writes head g's
// planes, k and v [n][head_dim] in double; they are scattered into the
// token-major dense layout.
template <class Fill>
void append_planes(DenseHistoryF64& h, int n, Fill fill) {
  const int H = h.n_kv_heads, d = h.head_dim;
  const size_t base = size_t(h.n_tokens) * H * d;
  h.k.resize(base + size_t(n) * H * d);
  h.v.resize(h.k.size());
  std::vector<double> kp(size_t(n) * d), vp(kp.size());
  for (int g = 0; g < H; ++g) {
    fill(g, kp.data(), vp.data());
    for (int t = 0; t < n; ++t) {
      for (int j = 0; j < d; ++j) {
        const size_t dst = base + (size_t(t) * H + g) * d + j;
        h.k[dst] = kp[size_t(t) * d + j];
        h.v[dst] = vp[size_t(t) * d + j];
      }
    }
  }
  h.n_tokens += n;
}

}  // namespace

void DenseHistoryF64::append(std::span<const std::byte> page, int n) {
  const kv::PageHeader hdr = kv::read_header(page);
  check_dims(*this, hdr.n_kv_heads, hdr.head_dim);
  if (n < 0 || n > hdr.n_tokens) {
    throw InvalidArgument(fmt::format("DenseHistoryF64: {} tokens requested from a page holding {}", n, hdr.n_tokens));
  }
  const int H = hdr.n_kv_heads, d = hdr.head_dim;
  const size_t m = size_t(n) * d;
  if (hdr.format == kv::CodecFormat::int8s) {
    const kv::Int8sPageView view = kv::parse_int8s_page(page);
    append_planes(*this, n, [&](int g, double* k_out, double* v_out) {
      const kv::Int8sHeadView hv = view.head(g);
      for (size_t i = 0; i < m; ++i) {
        const size_t t = i / size_t(d), j = i % size_t(d);
        k_out[i] = double(hv.c(j)) * double(hv.s(t)) * double(hv.kq[i]);  // exact in double
        v_out[i] = double(hv.v(j)) * double(hv.vq[i]);
      }
    });
    return;
  }
  const kv::Lossless13PageView view = kv::parse_lossless13_page(page);
  std::vector<float> kf(m), vf(m);
  append_planes(*this, n, [&](int g, double* k_out, double* v_out) {
    view.decode_plane(g, m, kf.data());
    view.decode_plane(H + g, m, vf.data());
    std::copy(kf.begin(), kf.end(), k_out);
    std::copy(vf.begin(), vf.end(), v_out);
  });
}

void DenseHistoryF64::append(const kv::KvShape& s, std::span<const bf16> page, int n) {
  check_dims(*this, s.n_kv_heads, s.head_dim);
  if (page.size() != s.page_elements()) {
    throw InvalidArgument(fmt::format("DenseHistoryF64: a page of {} values, the shape's pages hold {}", page.size(),
                                      s.page_elements()));
  }
  if (n < 0 || n > s.page_size) {
    throw InvalidArgument(fmt::format("DenseHistoryF64: {} tokens requested from a page of {}", n, s.page_size));
  }
  const size_t plane = s.plane_elements(), m = size_t(n) * s.head_dim;
  append_planes(*this, n, [&](int g, double* k_out, double* v_out) {
    for (size_t i = 0; i < m; ++i) {
      k_out[i] = bf16_to_f32(page[size_t(g) * plane + i]);
      v_out[i] = bf16_to_f32(page[size_t(s.n_kv_heads + g) * plane + i]);
    }
  });
}

void DenseHistoryF64::append(const kv::PageStore& store, kv::PageId id, int n) {
  const kv::KvShape& s = store.shape();
  check_dims(*this, s.n_kv_heads, s.head_dim);
  if (n < 0 || n > s.page_size) {
    throw InvalidArgument(fmt::format("DenseHistoryF64: {} tokens requested from a page of {}", n, s.page_size));
  }
  std::vector<float> kf(size_t(n) * s.head_dim), vf(kf.size());
  append_planes(*this, n, [&](int g, double* k_out, double* v_out) {
    kv::decode_elements(s.format, store.k_plane(id, g), kf.size(), kf.data());
    kv::decode_elements(s.format, store.v_plane(id, g), vf.size(), vf.data());
    std::copy(kf.begin(), kf.end(), k_out);
    std::copy(vf.begin(), vf.end(), v_out);
  });
}

DenseHistoryF64 dequantize_history(std::span<const kv::EncodedPage* const> pages, int64_t first_token,
                                   int64_t history_tokens) {
  DenseHistoryF64 h;
  h.first_token = first_token;
  for (size_t i = 0; i < pages.size(); ++i) {
    if (pages[i] == nullptr) throw InvalidArgument(fmt::format("dequantize_history: page {} is null", i));
    const kv::PageHeader hdr = kv::read_header(pages[i]->bytes);
    const int64_t tok0 = first_token + int64_t(i) * hdr.page_size;
    if (tok0 >= history_tokens) break;
    h.append(*pages[i], int(std::min<int64_t>(hdr.page_size, history_tokens - tok0)));
  }
  return h;
}

ReferencePartial reference_attention(const DenseHistoryF64& h, const QueryRows& q, const AttentionOptions& opt) {
  if (h.n_kv_heads <= 0 || q.n_heads % h.n_kv_heads != 0) {
    throw InvalidArgument(fmt::format("reference_attention: {} query heads is not a multiple of {} KV heads",
                                      q.n_heads, h.n_kv_heads));
  }
  const int d = h.head_dim, group = q.n_heads / h.n_kv_heads;
  const double scale = opt.softmax_scale != 0.0f ? double(opt.softmax_scale) : 1.0 / std::sqrt(double(d));
  ReferencePartial out;
  out.n_rows = q.n_rows;
  out.n_heads = q.n_heads;
  out.head_dim = d;
  out.o.assign(size_t(q.n_rows) * q.n_heads * d, 0.0);
  out.lse.assign(size_t(q.n_rows) * q.n_heads, -kInf);
  const int n_items = q.n_rows * q.n_heads;
#pragma omp parallel for schedule(dynamic)
  for (int item = 0; item < n_items; ++item) {
    const int r = item / q.n_heads, head = item % q.n_heads, g = head / group;
    const float* qr = q.q + (size_t(r) * q.n_heads + head) * d;
    const int64_t visible = std::min<int64_t>(h.n_tokens, q.positions[r] - h.first_token + 1);
    // Sliding window: keys at positions > p - window only.
    const int64_t lo = opt.window > 0 ? std::max<int64_t>(0, q.positions[r] - opt.window + 1 - h.first_token) : 0;
    if (visible <= lo) continue;
    std::vector<double> s(static_cast<size_t>(visible), 0.0);
    double m = -kInf;
    for (int64_t t = lo; t < visible; ++t) {
      double dot = 0;
      for (int j = 0; j < d; ++j) dot += double(qr[j]) * h.k_at(t, g, j);
      s[size_t(t)] = dot * scale;
      m = std::max(m, s[size_t(t)]);
    }
    double sum = 0;
    for (int64_t t = lo; t < visible; ++t) sum += (s[size_t(t)] = std::exp(s[size_t(t)] - m));
    double* o = out.o.data() + (size_t(r) * q.n_heads + head) * d;
    for (int64_t t = lo; t < visible; ++t) {
      const double w = s[size_t(t)] / sum;
      for (int j = 0; j < d; ++j) o[j] += w * h.v_at(t, g, j);
    }
    out.lse[size_t(r) * q.n_heads + head] = m + std::log(sum);
  }
  return out;
}

double own_format_error(const Partial& kernel, const ReferencePartial& ref) {
  if (kernel.n_rows != ref.n_rows || kernel.n_heads != ref.n_heads || kernel.head_dim != ref.head_dim) {
    throw InvalidArgument(fmt::format("own_format_error: kernel partial {}x{}x{} vs reference {}x{}x{}", kernel.n_rows,
                                      kernel.n_heads, kernel.head_dim, ref.n_rows, ref.n_heads, ref.head_dim));
  }
  double worst = 0;
  for (int r = 0; r < ref.n_rows; ++r) {
    for (int h = 0; h < ref.n_heads; ++h) {
      const bool ref_empty = ref.lse_at(r, h) == -kInf;
      const bool ker_empty = kernel.lse_at(r, h) == -std::numeric_limits<float>::infinity();
      if (ref_empty && ker_empty) continue;
      if (ref_empty != ker_empty || !std::isfinite(kernel.lse_at(r, h))) return kInf;
      double diff = 0, norm = 0;
      for (int j = 0; j < ref.head_dim; ++j) {
        const double k = kernel.o_at(r, h)[j], o = ref.o_at(r, h)[j];
        if (!std::isfinite(k)) return kInf;
        diff = std::max(diff, std::fabs(k - o));
        norm = std::max(norm, std::fabs(o));
      }
      if (norm == 0) {
        if (diff != 0) return kInf;
        continue;
      }
      worst = std::max(worst, diff / norm);
    }
  }
  return worst;
}

}  // namespace activekv::attention
