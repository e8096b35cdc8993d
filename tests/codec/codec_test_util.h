// Helpers for the codec tests: random bf16 pages in the PageStore layout.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "activekv/core/bf16.h"
#include "activekv/kv/page_store.h"

namespace activekv::testing {

inline kv::KvShape codec_shape(int page_size, int kv_heads, int head_dim) {
  kv::KvShape s;
  s.n_layers = 1;
  s.n_kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.page_size = page_size;
  return s;
}

/// Random page, K channels of different scale (like real keys), V ~ N(0,1).
inline std::vector<bf16> random_page(const kv::KvShape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<bf16> page(s.page_elements());
  const size_t plane = s.plane_elements();
  for (size_t i = 0; i < page.size(); ++i) {
    const bool is_k = i < plane * size_t(s.n_kv_heads);
    const float scale = is_k ? 1.0f + float(i % size_t(s.head_dim)) / 4.0f : 1.0f;
    page[i] = f32_to_bf16(n01(rng) * scale);
  }
  return page;
}

/// Element index of (plane p, token t, channel j) in the page layout.
inline size_t at(const kv::KvShape& s, int plane, int t, int j) {
  return size_t(plane) * s.plane_elements() + size_t(t) * s.head_dim + size_t(j);
}

}  // namespace activekv::testing
