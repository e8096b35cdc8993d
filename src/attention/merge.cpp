#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "activekv/attention/partial.h"
#include "activekv/core/error.h"

namespace activekv::attention {

Partial::Partial(int rows, int heads, int dim)
    : n_rows(rows),
      n_heads(heads),
      head_dim(dim),
      o(size_t(rows) * heads * dim, 0.0f),
      lse(size_t(rows) * heads, -std::numeric_limits<float>::infinity()) {}

float merge_states(std::span<const float* const> o, std::span<const float> lse, int head_dim,
                   float* out_o) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  float m = neg_inf;
  for (float l : lse) m = std::max(m, l);
  for (int d = 0; d < head_dim; ++d) out_o[d] = 0.0f;
  if (m == neg_inf) return neg_inf;  // every state empty
  float w_sum = 0.0f;
  for (size_t a = 0; a < lse.size(); ++a) {
    if (lse[a] == neg_inf) continue;  // empty: never read its O
    const float w = std::exp(lse[a] - m);
    w_sum += w;
    for (int d = 0; d < head_dim; ++d) out_o[d] += w * o[a][d];
  }
  const float inv = 1.0f / w_sum;
  for (int d = 0; d < head_dim; ++d) out_o[d] *= inv;
  return m + std::log(w_sum);
}

Partial merge(std::span<const Partial> parts) {
  if (parts.empty()) throw InvalidArgument("attention::merge: no partials to merge");
  const Partial& first = parts.front();
  for (const Partial& p : parts) {
    if (p.n_rows != first.n_rows || p.n_heads != first.n_heads || p.head_dim != first.head_dim) {
      throw InvalidArgument(fmt::format(
          "attention::merge: partial shape [{}][{}][{}] differs from [{}][{}][{}]", p.n_rows,
          p.n_heads, p.head_dim, first.n_rows, first.n_heads, first.head_dim));
    }
  }
  if (parts.size() == 1) return first;
  Partial out(first.n_rows, first.n_heads, first.head_dim);
  std::vector<const float*> o(parts.size());
  std::vector<float> lse(parts.size());
  for (int r = 0; r < first.n_rows; ++r) {
    for (int h = 0; h < first.n_heads; ++h) {
      for (size_t a = 0; a < parts.size(); ++a) {
        o[a] = parts[a].o_at(r, h);
        lse[a] = parts[a].lse_at(r, h);
      }
      out.lse_at(r, h) = merge_states(o, lse, first.head_dim, out.o_at(r, h));
    }
  }
  return out;
}

}  // namespace activekv::attention
