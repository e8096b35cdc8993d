// fp64 reference attention over a contiguous history, for tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace activekv::testing {

/// History for one layer as plain arrays: k, v [n_tokens][n_kv_heads][head_dim].
struct DenseHistory {
  int n_tokens = 0, n_kv_heads = 0, head_dim = 0;
  std::vector<double> k, v;
  double k_at(int t, int h, int d) const { return k[(size_t(t) * n_kv_heads + h) * head_dim + d]; }
  double v_at(int t, int h, int d) const { return v[(size_t(t) * n_kv_heads + h) * head_dim + d]; }
};

/// Causal softmax attention of one query row (q [n_heads][head_dim], position
/// pos) over keys [key_begin, min(key_end, pos+1)). Returns O [n_heads][head_dim]
/// and LSE [n_heads] (-inf if no key is visible).
inline void reference_attention(const DenseHistory& h, const float* q, int n_heads, int64_t pos,
                                double scale, int key_begin, int key_end, std::vector<double>& o,
                                std::vector<double>& lse) {
  const int group = n_heads / h.n_kv_heads;
  o.assign(size_t(n_heads) * h.head_dim, 0.0);
  lse.assign(size_t(n_heads), -std::numeric_limits<double>::infinity());
  const int end = int(std::min<int64_t>(key_end, pos + 1));
  for (int head = 0; head < n_heads; ++head) {
    const int g = head / group;
    std::vector<double> s;
    double m = -std::numeric_limits<double>::infinity();
    for (int t = key_begin; t < end; ++t) {
      double dot = 0;
      for (int d = 0; d < h.head_dim; ++d) dot += double(q[head * h.head_dim + d]) * h.k_at(t, g, d);
      s.push_back(dot * scale);
      m = std::max(m, s.back());
    }
    if (s.empty()) continue;
    double sum = 0;
    for (double& x : s) sum += (x = std::exp(x - m));
    for (int t = key_begin; t < end; ++t) {
      for (int d = 0; d < h.head_dim; ++d) {
        o[size_t(head) * h.head_dim + d] += s[size_t(t - key_begin)] / sum * h.v_at(t, g, d);
      }
    }
    lse[size_t(head)] = m + std::log(sum);
  }
}

}  // namespace activekv::testing
