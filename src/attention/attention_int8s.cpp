// int8s attention reading the codes directly (see attention_codecs.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <vector>

#include "activekv/attention/attention_codecs.h"
#include "activekv/attention/int8s_query.h"
#include "activekv/kv/codec_int8s.h"
#include "codec_tile.h"

namespace activekv::attention {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

[[gnu::always_inline]] inline int32_t dot_i8(const int8_t* a, const int8_t* b, int d) {
  int32_t dot = 0;
  for (int j = 0; j < d; ++j) dot += int32_t(a[j]) * int32_t(b[j]);
  return dot;
}

// Per-thread buffers of attend_row, sized once per tile.
struct RowScratch {
  explicit RowScratch(size_t d) : qp(d), residual(d), acc(d), u(d), qq(d), qq_lo(d) {}
  std::vector<float> qp, residual, scores, acc, u;
  std::vector<int8_t> qq, qq_lo;
};

// One page's KV head as the kernel reads it: codes in the blob, scales
// widened to fp32 once per tile (exact).
struct HeadScales {
  const float* c;   // [head_dim] key channel scales
  const float* s;   // [n_tokens] key token scales
  const float* v;   // [head_dim] value channel scales
  const int8_t* kq;  // [n_tokens][head_dim]
  const int8_t* vq;  // [n_tokens][head_dim]
};

// The tile's pages, widened: head(p, g) for page p, KV head g.
class TileScales {
 public:
  TileScales(std::span<const kv::Int8sPageView> pages, size_t n_read) : n_kv_heads_(0) {
    if (n_read == 0) return;
    const kv::PageHeader& h0 = pages[0].header;
    n_kv_heads_ = h0.n_kv_heads;
    const size_t d = size_t(h0.head_dim);
    size_t total = 0;
    for (size_t p = 0; p < n_read; ++p) total += size_t(n_kv_heads_) * (2 * d + size_t(pages[p].header.n_tokens));
    floats_.resize(total);
    float* f = floats_.data();
    for (size_t p = 0; p < n_read; ++p) {
      const size_t n = size_t(pages[p].header.n_tokens);
      page_size_.push_back(pages[p].header.page_size);
      for (int g = 0; g < n_kv_heads_; ++g) {
        const kv::Int8sHeadView hv = pages[p].head(g);
        HeadScales hs{f, f + d, f + d + n, hv.kq, hv.vq};
        kv::fp16_to_f32(hv.c_fp16, d, f);
        kv::fp16_to_f32(hv.s_fp16, n, f + d);
        kv::fp16_to_f32(hv.v_fp16, d, f + d + n);
        f += 2 * d + n;
        heads_.push_back(hs);
      }
    }
  }
  size_t n_pages() const { return page_size_.size(); }
  int page_size(size_t p) const { return page_size_[p]; }
  const HeadScales& head(size_t p, int g) const { return heads_[p * size_t(n_kv_heads_) + size_t(g)]; }

 private:
  int n_kv_heads_;
  std::vector<float> floats_;
  std::vector<HeadScales> heads_;
  std::vector<int> page_size_;
};

// One (query row, query head) over the tile's pages; writes O and LSE.
// Inlined into two entry points, compiled for AVX2 and for the baseline
// (attend_row_avx2 / attend_row_base, chosen at run time: no ifunc, which
// the sanitizer builds cannot start with). AVX2 vectorises the integer dots
// and the per-channel loops 2x wider. Same bits either way: integer sums are
// exact, every float operation stays per element in the same order (no float
// reduction is reordered, and no FMA is enabled).
[[gnu::always_inline]] inline void attend_row(const TileScales& pages, int64_t first_token, int64_t end,
                                              const float* q, int64_t pos, int64_t window, int kv_head, int d,
                                              float scale, int query_terms, RowScratch& sc, float* o_out,
                                              float& lse_out) {
  std::vector<float>& qp = sc.qp;
  std::vector<float>& residual = sc.residual;
  std::vector<float>& scores = sc.scores;
  std::vector<float>& acc = sc.acc;
  std::vector<float>& u = sc.u;
  std::vector<int8_t>& qq = sc.qq;
  std::vector<int8_t>& qq_lo = sc.qq_lo;
  std::fill(acc.begin(), acc.end(), 0.0f);
  float m = kNegInf, l = 0.0f;
  for (size_t p = 0; p < pages.n_pages(); ++p) {
    const HeadScales& hv = pages.head(p, kv_head);
    const int64_t tok0 = first_token + int64_t(p) * pages.page_size(p);
    const int64_t visible = std::min<int64_t>(std::min<int64_t>(end, pos + 1) - tok0, pages.page_size(p));
    if (visible <= 0) break;
    // With a sliding window the row sees keys t >= lo of this page only.
    const int64_t lo = window > 0 ? std::max<int64_t>(0, pos - window + 1 - tok0) : 0;
    if (lo >= visible) continue;
    // Fold the channel scales into the query and quantise it to int8 (one
    // scale per row and page); with two terms the rounding residual becomes a
    // second int8 code on a 127x finer grid (int8s_query.h).
    const float a = quantise_int8s_query(q, hv.c, d, query_terms, qp.data(), residual.data(), qq.data(), qq_lo.data());
    const float row_scale = a * scale;
    scores.resize(size_t(visible));
    float page_max = kNegInf;
    for (int64_t t = lo; t < visible; ++t) {
      const int8_t* k = hv.kq + size_t(t) * d;
      float dot = float(dot_i8(qq.data(), k, d));
      if (query_terms == 2) dot += float(dot_i8(qq_lo.data(), k, d)) / 127.0f;
      scores[size_t(t)] = (dot * hv.s[t]) * row_scale;
      page_max = std::max(page_max, scores[size_t(t)]);
    }
    const float m_new = std::max(m, page_max);
    const float alpha = m == kNegInf ? 0.0f : std::exp(m - m_new);
    std::fill(u.begin(), u.end(), 0.0f);
    float sum = 0.0f;
    for (int64_t t = lo; t < visible; ++t) {
      const float pt = std::exp(scores[size_t(t)] - m_new);
      sum += pt;
      const int8_t* v = hv.vq + size_t(t) * d;
      for (int j = 0; j < d; ++j) u[size_t(j)] += pt * float(v[j]);
    }
    l = l * alpha + sum;
    m = m_new;
    for (int j = 0; j < d; ++j) acc[size_t(j)] = acc[size_t(j)] * alpha + hv.v[j] * u[size_t(j)];
  }
  if (m == kNegInf || l == 0.0f) return;  // no visible key: stays empty
  const float inv = 1.0f / l;
  for (int j = 0; j < d; ++j) o_out[j] = acc[size_t(j)] * inv;
  lse_out = m + std::log(l);
}

using AttendRowFn = void (*)(const TileScales&, int64_t, int64_t, const float*, int64_t, int64_t, int, int, float,
                             int, RowScratch&, float*, float&);

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx2"))) void attend_row_avx2(const TileScales& pages, int64_t first_token, int64_t end,
                                                     const float* q, int64_t pos, int64_t window, int kv_head, int d,
                                                     float scale, int query_terms, RowScratch& sc, float* o_out,
                                                     float& lse_out) {
  attend_row(pages, first_token, end, q, pos, window, kv_head, d, scale, query_terms, sc, o_out, lse_out);
}
#endif

void attend_row_base(const TileScales& pages, int64_t first_token, int64_t end, const float* q, int64_t pos,
                     int64_t window, int kv_head, int d, float scale, int query_terms, RowScratch& sc, float* o_out,
                     float& lse_out) {
  attend_row(pages, first_token, end, q, pos, window, kv_head, d, scale, query_terms, sc, o_out, lse_out);
}

AttendRowFn pick_attend_row() {
#if defined(__x86_64__) || defined(__i386__)
  if (__builtin_cpu_supports("avx2")) return attend_row_avx2;
#endif
  return attend_row_base;
}

}  // namespace

Partial attend_int8s_tile(std::span<const kv::Int8sPageView> pages, int64_t first_token, int64_t history_tokens,
                          const QueryRows& q, const AttentionOptions& opt) {
  const detail::CodecTile tile =
      detail::check_view_tile("int8s attention", kv::CodecFormat::int8s, pages, first_token, history_tokens, q);
  const int d = tile.first.head_dim;
  const int group = q.n_heads / tile.first.n_kv_heads;
  const float scale = opt.softmax_scale != 0.0f ? opt.softmax_scale : 1.0f / std::sqrt(float(d));
  const TileScales scales(pages, tile.n_read);

  static const AttendRowFn attend_row_fn = pick_attend_row();
  Partial out(q.n_rows, q.n_heads, d);
  const int n_items = q.n_rows * q.n_heads;
#pragma omp parallel
  {
    RowScratch scratch{static_cast<size_t>(d)};
#pragma omp for schedule(dynamic)
    for (int item = 0; item < n_items; ++item) {
      const int r = item / q.n_heads, head = item % q.n_heads;
      attend_row_fn(scales, first_token, tile.end, q.q + (size_t(r) * q.n_heads + head) * d, q.positions[r],
                    opt.window, head / group, d, scale, opt.int8s_query_terms, scratch, out.o_at(r, head),
                    out.lse_at(r, head));
    }
  }
  return out;
}

Partial attend_int8s_tile(std::span<const kv::EncodedPage* const> pages, int64_t first_token,
                          int64_t history_tokens, const QueryRows& q, const AttentionOptions& opt) {
  const detail::CodecTile tile =
      detail::check_codec_tile("int8s attention", kv::CodecFormat::int8s, pages, first_token, history_tokens, q);
  std::vector<kv::Int8sPageView> views;
  views.reserve(std::max<size_t>(tile.n_read, 1));
  for (size_t i = 0; i < std::max<size_t>(tile.n_read, 1); ++i) views.push_back(kv::parse_int8s_page(*pages[i]));
  return attend_int8s_tile(std::span<const kv::Int8sPageView>(views), first_token, history_tokens, q, opt);
}

}  // namespace activekv::attention
