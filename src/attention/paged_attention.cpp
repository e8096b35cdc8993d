#include "activekv/attention/paged_attention.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "activekv/core/blas.h"
#include "activekv/core/error.h"

namespace activekv::attention {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void check_shapes(const LayerHistory& h, const QueryRows& q) {
  const kv::KvShape& s = h.store->shape();
  if (q.n_heads <= 0 || q.n_heads % s.n_kv_heads != 0) {
    throw InvalidArgument(fmt::format("attention: {} query heads is not a multiple of {} KV heads",
                                      q.n_heads, s.n_kv_heads));
  }
  if (h.n_tokens > int64_t(h.page_table.size()) * s.page_size) {
    throw InvalidArgument(fmt::format("attention: {} tokens but the page table holds only {} pages",
                                      h.n_tokens, h.page_table.size()));
  }
  for (int r = 0; r < q.n_rows; ++r) {
    if (q.positions[r] < 0 || q.positions[r] >= h.n_tokens) {
      throw InvalidArgument(fmt::format("attention: row {} position {} outside history of {} tokens",
                                        r, q.positions[r], h.n_tokens));
    }
  }
}

// Online-softmax update of rows [0, M) with the scores of one page.
// Row i belongs to query row i / group and may see page keys
// key_first[i / group] <= t <= key_limit[i / group].
void softmax_update(Workspace& ws, int M, int n_keys, int group, int head_dim) {
  const std::vector<int64_t>& limit = ws.key_limit;
  const std::vector<int64_t>& first = ws.key_first;
#pragma omp parallel for schedule(static) if (M >= 64)
  for (int i = 0; i < M; ++i) {
    float* s = ws.scores.data() + size_t(i) * n_keys;
    const int64_t visible = std::min<int64_t>(n_keys, limit[size_t(i / group)] + 1);
    const int64_t lo = std::clamp<int64_t>(first[size_t(i / group)], 0, std::max<int64_t>(visible, 0));
    float page_max = kNegInf;
    for (int64_t t = lo; t < visible; ++t) page_max = std::max(page_max, s[t]);
    const float m_old = ws.row_max[size_t(i)];
    const float m_new = std::max(m_old, page_max);
    float sum = 0.0f;
    for (int64_t t = lo; t < visible; ++t) {
      s[t] = std::exp(s[t] - m_new);
      sum += s[t];
    }
    for (int64_t t = 0; t < lo; ++t) s[t] = 0.0f;
    for (int64_t t = std::max<int64_t>(visible, 0); t < n_keys; ++t) s[t] = 0.0f;
    if (m_new == kNegInf) continue;  // nothing visible yet: state stays empty
    const float alpha = (m_old == kNegInf) ? 0.0f : std::exp(m_old - m_new);
    ws.row_sum[size_t(i)] = ws.row_sum[size_t(i)] * alpha + sum;
    ws.row_max[size_t(i)] = m_new;
    if (alpha != 1.0f) {
      float* acc = ws.acc.data() + size_t(i) * head_dim;
      for (int d = 0; d < head_dim; ++d) acc[d] *= alpha;
    }
  }
}

// Attention of one KV head's query group over the tile; writes into `out`.
void attend_group(const LayerHistory& h, size_t first_page, size_t n_pages, const QueryRows& q,
                  int kv_head, float scale, int64_t window, Workspace& ws, Partial& out) {
  const kv::KvShape& s = h.store->shape();
  const int d = s.head_dim;
  const int group = q.n_heads / s.n_kv_heads;
  const int M = q.n_rows * group;
  const int64_t max_pos = *std::max_element(q.positions, q.positions + q.n_rows);

  ws.q_group.resize(size_t(M) * d);
  for (int r = 0; r < q.n_rows; ++r) {
    const float* src = q.q + (size_t(r) * q.n_heads + size_t(kv_head) * group) * d;
    std::copy_n(src, size_t(group) * d, ws.q_group.data() + size_t(r) * group * d);
  }
  ws.acc.assign(size_t(M) * d, 0.0f);
  ws.row_max.assign(size_t(M), kNegInf);
  ws.row_sum.assign(size_t(M), 0.0f);
  ws.key_limit.resize(size_t(q.n_rows));
  ws.key_first.resize(size_t(q.n_rows));
  const int64_t first_token = first_visible_token(q, window);

  for (size_t p = first_page; p < first_page + n_pages; ++p) {
    const int64_t tok0 = int64_t(p) * s.page_size;
    if (tok0 >= h.n_tokens || tok0 > max_pos) break;
    if (tok0 + s.page_size <= first_token) continue;  // before every row's window
    const int n_keys = int(std::min<int64_t>(s.page_size, h.n_tokens - tok0));
    const kv::PageId id = h.page_table[p];
    ws.k.resize(size_t(n_keys) * d);
    ws.v.resize(size_t(n_keys) * d);
    if (!h.read_planes || !h.read_planes(p, kv_head, n_keys, ws.k.data(), ws.v.data())) {
      kv::decode_elements(s.format, h.store->k_plane(id, kv_head), size_t(n_keys) * d, ws.k.data());
      kv::decode_elements(s.format, h.store->v_plane(id, kv_head), size_t(n_keys) * d, ws.v.data());
    }
    for (int r = 0; r < q.n_rows; ++r) {
      ws.key_limit[size_t(r)] = q.positions[r] - tok0;
      ws.key_first[size_t(r)] = window > 0 ? q.positions[r] - window + 1 - tok0 : 0;
    }

    ws.scores.resize(size_t(M) * n_keys);
    gemm_nt(M, n_keys, d, scale, ws.q_group.data(), d, ws.k.data(), d, 0.0f, ws.scores.data(), n_keys);
    softmax_update(ws, M, n_keys, group, d);
    gemm_nn(M, d, n_keys, 1.0f, ws.scores.data(), n_keys, ws.v.data(), d, 1.0f, ws.acc.data(), d);
  }

  for (int i = 0; i < M; ++i) {
    const int r = i / group, head = kv_head * group + i % group;
    const float l = ws.row_sum[size_t(i)];
    float* o = out.o_at(r, head);
    if (ws.row_max[size_t(i)] == kNegInf || l == 0.0f) continue;  // empty row stays -inf
    const float inv = 1.0f / l;
    for (int k = 0; k < d; ++k) o[k] = ws.acc[size_t(i) * d + k] * inv;
    out.lse_at(r, head) = ws.row_max[size_t(i)] + std::log(l);
  }
}

}  // namespace

int64_t first_visible_token(const QueryRows& q, int64_t window) {
  if (window <= 0 || q.n_rows == 0) return 0;
  const int64_t min_pos = *std::min_element(q.positions, q.positions + q.n_rows);
  return std::max<int64_t>(0, min_pos - window + 1);
}

size_t first_visible_page(const QueryRows& q, int64_t window, int page_size) {
  return size_t(first_visible_token(q, window) / page_size);
}

Partial attend_tile(const LayerHistory& history, size_t first_page, size_t n_pages,
                    const QueryRows& q, const AttentionOptions& opt, Workspace& ws) {
  check_shapes(history, q);
  const kv::KvShape& s = history.store->shape();
  if (first_page + n_pages > history.page_table.size()) {
    throw InvalidArgument(fmt::format("attention: tile pages [{}, {}) outside page table of {}",
                                      first_page, first_page + n_pages, history.page_table.size()));
  }
  const float scale = opt.softmax_scale != 0.0f ? opt.softmax_scale : 1.0f / std::sqrt(float(s.head_dim));
  Partial out(q.n_rows, q.n_heads, s.head_dim);
  if (opt.window < 0) throw InvalidArgument(fmt::format("attention: negative window {}", opt.window));
  for (int g = 0; g < s.n_kv_heads; ++g) {
    attend_group(history, first_page, n_pages, q, g, scale, opt.window, ws, out);
  }
  return out;
}

Partial attend(const LayerHistory& history, const QueryRows& q, const AttentionOptions& opt,
               Workspace& ws) {
  if (opt.tile_pages <= 0) {
    throw InvalidArgument(fmt::format("attention: tile_pages must be positive, got {}", opt.tile_pages));
  }
  const int64_t page_size = history.store->shape().page_size;
  const size_t used_pages = size_t((history.n_tokens + page_size - 1) / page_size);
  const size_t tile = size_t(opt.tile_pages);
  if (used_pages <= tile) return attend_tile(history, 0, used_pages, q, opt, ws);
  // Tiles stay aligned to multiples of tile_pages; those wholly before the
  // window are not read.
  const size_t first = std::min(first_visible_page(q, opt.window, int(page_size)), used_pages);
  std::vector<Partial> tiles;
  for (size_t p = first - first % tile; p < used_pages; p += tile) {
    tiles.push_back(attend_tile(history, p, std::min(tile, used_pages - p), q, opt, ws));
  }
  return merge(tiles);
}

}  // namespace activekv::attention
