// Helpers for the compressed-page attention tests.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "activekv/attention/paged_attention.h"
#include "activekv/core/bf16.h"
#include "activekv/kv/codec.h"
#include "activekv/kv/codec_int8s.h"

namespace activekv::testing {

/// Token-major fp32 history k, v [n_tokens][n_kv_heads][head_dim].
struct RawHistory {
  int n_tokens = 0, n_kv_heads = 0, head_dim = 0;
  std::vector<float> k, v;
};

/// The one-layer KvShape of a raw history with this page size.
inline kv::KvShape layer_shape(const RawHistory& h, int page_size) {
  kv::KvShape s;
  s.n_layers = 1;
  s.n_kv_heads = h.n_kv_heads;
  s.head_dim = h.head_dim;
  s.page_size = page_size;
  return s;
}

/// Splits a raw history into bf16 pages of the PageStore layout (the last
/// page holds the remainder; its unwritten tokens are zero).
inline std::vector<std::vector<bf16>> bf16_pages(const RawHistory& h, int page_size) {
  const kv::KvShape s = layer_shape(h, page_size);
  std::vector<std::vector<bf16>> pages;
  for (int t0 = 0; t0 < h.n_tokens; t0 += page_size) {
    const int n = std::min(page_size, h.n_tokens - t0);
    std::vector<bf16> page(s.page_elements());
    for (int g = 0; g < h.n_kv_heads; ++g) {
      for (int t = 0; t < n; ++t) {
        for (int j = 0; j < h.head_dim; ++j) {
          const size_t src = (size_t(t0 + t) * h.n_kv_heads + g) * h.head_dim + j;
          page[size_t(g) * s.plane_elements() + size_t(t) * h.head_dim + j] = f32_to_bf16(h.k[src]);
          page[size_t(h.n_kv_heads + g) * s.plane_elements() + size_t(t) * h.head_dim + j] = f32_to_bf16(h.v[src]);
        }
      }
    }
    pages.push_back(std::move(page));
  }
  return pages;
}

/// bf16_pages, encoded in format f.
inline std::vector<kv::EncodedPage> encode_history(const RawHistory& h, int page_size, kv::CodecFormat f,
                                                   kv::Int8sKeyScaling scaling = kv::Int8sKeyScaling::separable) {
  const kv::KvShape s = layer_shape(h, page_size);
  std::vector<kv::EncodedPage> pages;
  const std::vector<std::vector<bf16>> raw = bf16_pages(h, page_size);
  for (size_t p = 0; p < raw.size(); ++p) {
    const int n = std::min(page_size, h.n_tokens - int(p) * page_size);
    pages.push_back(f == kv::CodecFormat::int8s ? kv::encode_int8s_page(s, raw[p], n, scaling)
                                                : kv::encode_page(f, s, raw[p], n));
  }
  return pages;
}

inline std::vector<const kv::EncodedPage*> pointers(const std::vector<kv::EncodedPage>& pages, size_t first = 0,
                                                    size_t n = SIZE_MAX) {
  std::vector<const kv::EncodedPage*> out;
  for (size_t i = first; i < pages.size() && i < first + n; ++i) out.push_back(&pages[i]);
  return out;
}

/// A random history: keys N(0,1) (scores of unit spread after 1/sqrt(d)),
/// values N(0,1) around a per-channel mean drawn N(0,1), as real V has. Draws
/// from `rng` (the means first, then k and v element by element).
inline RawHistory random_history(int n_tokens, int n_kv_heads, int head_dim, std::mt19937& rng) {
  RawHistory h{n_tokens, n_kv_heads, head_dim, {}, {}};
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> v_mean(size_t(n_kv_heads) * head_dim);
  for (float& m : v_mean) m = n01(rng);
  for (size_t i = 0; i < size_t(n_tokens) * n_kv_heads * head_dim; ++i) {
    h.k.push_back(n01(rng));
    h.v.push_back(v_mean[i % v_mean.size()] + n01(rng));
  }
  return h;
}

}  // namespace activekv::testing
