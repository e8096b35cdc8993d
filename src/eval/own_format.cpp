// Own-format error along a route (SPEC §5 a): kernel output of the route
// against fp64 attention over the history exactly as the route reads it.
#include "activekv/eval/own_format.h"

#include <cmath>
#include <random>

#include "activekv/attention/attention_codecs.h"
#include "activekv/attention/quality.h"
#include "activekv/kv/codec_int8s.h"

namespace activekv::eval {
namespace {

kv::CodecFormat codec_of(route::ReadFormat f) {
  return f == route::ReadFormat::lossless13 ? kv::CodecFormat::lossless13 : kv::CodecFormat::int8s;
}

}  // namespace

double route_own_format_error(const attention::LayerHistory& h, int layer, convert::CompressedHistory& c,
                              const route::RouteConfig& cfg, const attention::QueryRows& q,
                              const attention::AttentionOptions& opt, const route::Int8sTileFn& int8s_tile) {
  const kv::KvShape& s = h.store->shape();
  route::RoutedView view{&c, cfg, nullptr, int8s_tile};
  attention::Workspace ws;
  const attention::Partial kernel = route::attend_routed(h, layer, view, q, opt, ws);

  // The reference reads the pages the route planned (from the window's first
  // page on, as attend_routed does), and applies the same window per row.
  const route::PublishedFn published = [&](size_t p, route::ReadFormat f) {
    return !c.published(layer, p, codec_of(f)).empty();
  };
  const route::RoutePlan plan = route::plan_route(cfg, h.n_tokens, s.page_size, published,
                                                  attention::first_visible_page(q, opt.window, s.page_size));
  attention::DenseHistoryF64 ref;
  ref.first_token = int64_t(plan.first_page) * s.page_size;
  for (size_t p = plan.first_page; p < plan.page_format.size(); ++p) {
    const int n = int(std::min<int64_t>(s.page_size, h.n_tokens - int64_t(p) * s.page_size));
    if (plan.page_format[p] == route::ReadFormat::exact) {
      ref.append(*h.store, h.page_table[p], n);
    } else {
      ref.append(c.published(layer, p, codec_of(plan.page_format[p])), n);
    }
  }
  return attention::own_format_error(kernel, attention::reference_attention(ref, q, opt));
}

SampleError own_format_sample(const std::string& text, const route::RouteCandidate& cand, const model::ModelConfig& mc,
                              int layer, const attention::LayerHistory& h, int history_layer,
                              convert::CompressedHistory& c, const float* q, int n_rows, const int64_t* pos,
                              const route::Int8sTileFn& int8s_tile) {
  const attention::QueryRows rows{q, n_rows, mc.n_heads, pos};
  // The options the forward runs this layer with (window, query scale), per query form.
  attention::AttentionOptions two = model::layer_attention_options(mc, layer), one = two;
  two.int8s_query_terms = 2;
  one.int8s_query_terms = 1;
  const route::RouteConfig lr = route::layer_route(cand.config, two.window);
  return {cand.name, text, layer, h.n_tokens,
          route_own_format_error(h, history_layer, c, lr, rows, two, int8s_tile),
          route_own_format_error(h, history_layer, c, lr, rows, one, int8s_tile)};
}

SyntheticErrors synthetic_outlier_errors(int n_tokens, int page_size, int n_kv_heads, int head_dim, int n_heads,
                                         int recent_pages, int tile_pages, const route::Int8sTileFn& int8s_tile) {
  // Keys: unit normal plus a per-channel offset, with 4 outlier channels per
  // head 50-100x larger (as real K has); values: normal with channel means.
  kv::PageStore store(kv::KvShape{1, n_kv_heads, head_dim, page_size});
  kv::SequenceKv seq(store);
  std::mt19937 rng(2026);
  std::normal_distribution<float> n01;
  std::uniform_real_distribution<float> gain(50.0f, 100.0f);
  const int row = n_kv_heads * head_dim;
  const size_t n_ch = static_cast<size_t>(row);
  std::vector<float> ch_gain(n_ch, 1.0f), ch_mean(n_ch), v_mean(n_ch);
  for (int i = 0; i < row; ++i) {
    ch_mean[size_t(i)] = 0.5f * n01(rng);
    v_mean[size_t(i)] = 0.5f * n01(rng);
  }
  for (int h = 0; h < n_kv_heads; ++h) {
    for (int j = 0; j < 4; ++j) ch_gain[size_t(h * head_dim + int(rng() % uint32_t(head_dim)))] = gain(rng);
  }
  std::vector<float> k(size_t(n_tokens) * row), v(k.size());
  for (int t = 0; t < n_tokens; ++t) {
    for (int i = 0; i < row; ++i) {
      k[size_t(t) * row + i] = (n01(rng) + ch_mean[size_t(i)]) * ch_gain[size_t(i)];
      v[size_t(t) * row + i] = n01(rng) + v_mean[size_t(i)];
    }
  }
  seq.reserve(n_tokens);
  seq.write(0, 0, n_tokens, k.data(), v.data());
  seq.commit(n_tokens);

  // Queries: small on the outlier channels, as trained models keep them.
  const int rows = 4;
  std::vector<float> q(size_t(rows) * n_heads * head_dim);
  for (size_t i = 0; i < q.size(); ++i) {
    const int ch = int(i % size_t(head_dim)), g = int(i / size_t(head_dim)) % n_heads / (n_heads / n_kv_heads);
    q[i] = n01(rng) * 0.35f / std::sqrt(ch_gain[size_t(g * head_dim + ch)]);
  }
  std::vector<int64_t> pos(rows);
  for (int r = 0; r < rows; ++r) pos[size_t(r)] = n_tokens - 1 - r;
  const attention::QueryRows qr{q.data(), rows, n_heads, pos.data()};
  const route::RouteConfig cfg{route::RouteKind::hybrid, recent_pages, tile_pages};
  const size_t pages = size_t((n_tokens + page_size - 1) / page_size);

  convert::CompressedHistory separable(seq, {kv::CodecFormat::int8s}, pages, nullptr);
  separable.schedule();
  const attention::LayerHistory h{&store, seq.page_table(0), n_tokens};
  SyntheticErrors out;
  for (int terms : {1, 2}) {
    attention::AttentionOptions opt;
    opt.int8s_query_terms = terms;
    out.separable[terms - 1] = route_own_format_error(h, 0, separable, cfg, qr, opt, int8s_tile);
  }

  // The plain per-token quantiser on the same pages, through the same kernel.
  std::vector<kv::EncodedPage> plain;
  std::vector<const kv::EncodedPage*> ptrs;
  const int64_t full = n_tokens / page_size;
  for (int64_t p = 1; p < full - recent_pages; ++p) {
    const bf16* page = reinterpret_cast<const bf16*>(store.k_plane(seq.page_table(0)[size_t(p)], 0));
    plain.push_back(kv::encode_int8s_page(store.shape(), {page, store.shape().page_elements()}, page_size,
                                          kv::Int8sKeyScaling::per_token_only));
  }
  std::vector<kv::Int8sPageView> views;
  for (const auto& e : plain) {
    ptrs.push_back(&e);
    views.push_back(kv::parse_int8s_page(e));
  }
  const attention::DenseHistoryF64 ref = attention::dequantize_history(ptrs, page_size, n_tokens);
  const attention::ReferencePartial ref_o = attention::reference_attention(ref, qr, {});
  for (int terms : {1, 2}) {
    attention::AttentionOptions opt;
    opt.int8s_query_terms = terms;
    std::vector<attention::Partial> parts;
    for (size_t i = 0; i < ptrs.size(); i += size_t(tile_pages)) {
      const size_t n = std::min(size_t(tile_pages), ptrs.size() - i);
      const std::span<const kv::Int8sPageView> tile{views.data() + i, n};
      const int64_t first = int64_t(i + 1) * page_size;
      parts.push_back(int8s_tile ? int8s_tile(tile, first, n_tokens, qr, opt)
                                 : attention::attend_int8s_tile(tile, first, n_tokens, qr, opt));
    }
    out.per_token[terms - 1] = attention::own_format_error(attention::merge(parts), ref_o);
  }
  return out;
}

}  // namespace activekv::eval
