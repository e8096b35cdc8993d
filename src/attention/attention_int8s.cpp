// int8s attention reading the codes directly (see attention_codecs.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "activekv/attention/attention_codecs.h"
#include "activekv/kv/codec_int8s.h"
#include "codec_tile.h"

namespace activekv::attention {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One (query row, query head) over the tile's pages; writes O and LSE.
// Quantises x[d] to int8 codes with step `a` (round half even, clipped).
void quantise_row(const float* x, int d, float a, int8_t* out) {
  for (int j = 0; j < d; ++j) out[j] = a == 0.0f ? 0 : int8_t(std::clamp(std::nearbyint(x[j] / a), -127.0f, 127.0f));
}

int32_t dot_i8(const int8_t* a, const int8_t* b, int d) {
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

void attend_row(const std::vector<kv::Int8sPageView>& views, int64_t first_token, int64_t end, const float* q,
                int64_t pos, int kv_head, int d, float scale, int query_terms, RowScratch& sc, float* o_out,
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
  for (size_t p = 0; p < views.size(); ++p) {
    const kv::Int8sHeadView& hv = views[p].heads[size_t(kv_head)];
    const int64_t tok0 = first_token + int64_t(p) * views[p].header.page_size;
    const int64_t visible = std::min<int64_t>(std::min<int64_t>(end, pos + 1) - tok0, views[p].header.page_size);
    if (visible <= 0) break;
    // Fold the channel scales into the query and quantise it to int8 (one scale per row and page).
    float qmax = 0.0f;
    for (int j = 0; j < d; ++j) {
      qp[size_t(j)] = q[j] * hv.c[size_t(j)];
      qmax = std::max(qmax, std::fabs(qp[size_t(j)]));
    }
    const float a = qmax / 127.0f;
    quantise_row(qp.data(), d, a, qq.data());
    // Second term: the rounding residual, quantised on a grid 127x finer, so
    // q' = a*qq + (a/127)*qq_lo up to a/254/127 per channel (two int8 dots).
    const float a_lo = a / 127.0f;
    if (query_terms == 2) {
      for (int j = 0; j < d; ++j) residual[size_t(j)] = qp[size_t(j)] - a * float(qq[size_t(j)]);
      quantise_row(residual.data(), d, a_lo, qq_lo.data());
    }
    const float row_scale = a * scale;
    scores.resize(size_t(visible));
    float page_max = kNegInf;
    for (int64_t t = 0; t < visible; ++t) {
      const int8_t* k = hv.kq + size_t(t) * d;
      float dot = float(dot_i8(qq.data(), k, d));
      if (query_terms == 2) dot += float(dot_i8(qq_lo.data(), k, d)) / 127.0f;
      scores[size_t(t)] = (dot * hv.s[size_t(t)]) * row_scale;
      page_max = std::max(page_max, scores[size_t(t)]);
    }
    const float m_new = std::max(m, page_max);
    const float alpha = m == kNegInf ? 0.0f : std::exp(m - m_new);
    std::fill(u.begin(), u.end(), 0.0f);
    float sum = 0.0f;
    for (int64_t t = 0; t < visible; ++t) {
      const float pt = std::exp(scores[size_t(t)] - m_new);
      sum += pt;
      const int8_t* v = hv.vq + size_t(t) * d;
      for (int j = 0; j < d; ++j) u[size_t(j)] += pt * float(v[j]);
    }
    l = l * alpha + sum;
    m = m_new;
    for (int j = 0; j < d; ++j) acc[size_t(j)] = acc[size_t(j)] * alpha + hv.v[size_t(j)] * u[size_t(j)];
  }
  if (m == kNegInf || l == 0.0f) return;  // no visible key: stays empty
  const float inv = 1.0f / l;
  for (int j = 0; j < d; ++j) o_out[j] = acc[size_t(j)] * inv;
  lse_out = m + std::log(l);
}

}  // namespace

Partial attend_int8s_tile(std::span<const kv::EncodedPage* const> pages, int64_t first_token,
                          int64_t history_tokens, const QueryRows& q, const AttentionOptions& opt) {
  const detail::CodecTile tile =
      detail::check_codec_tile("int8s attention", kv::CodecFormat::int8s, pages, first_token, history_tokens, q);
  const int d = tile.first.head_dim;
  const int group = q.n_heads / tile.first.n_kv_heads;
  const float scale = opt.softmax_scale != 0.0f ? opt.softmax_scale : 1.0f / std::sqrt(float(d));
  std::vector<kv::Int8sPageView> views;
  views.reserve(tile.n_read);
  for (size_t i = 0; i < tile.n_read; ++i) views.push_back(kv::parse_int8s_page(*pages[i]));

  Partial out(q.n_rows, q.n_heads, d);
  const int n_items = q.n_rows * q.n_heads;
#pragma omp parallel
  {
    RowScratch scratch{static_cast<size_t>(d)};
#pragma omp for schedule(dynamic)
    for (int item = 0; item < n_items; ++item) {
      const int r = item / q.n_heads, head = item % q.n_heads;
      attend_row(views, first_token, tile.end, q.q + (size_t(r) * q.n_heads + head) * d, q.positions[r],
                 head / group, d, scale, opt.int8s_query_terms, scratch, out.o_at(r, head), out.lse_at(r, head));
    }
  }
  return out;
}

}  // namespace activekv::attention
