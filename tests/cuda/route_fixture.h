// Shared by the GPU tests of the formats and of head shards (tests/cuda,
// label `gpu`): a synthetic history written into the one pinned page store
// (K with per-channel offsets and outlier channels, as real K has), its
// int8s and lossless13 encodings in the store's arena, the page tables of
// each route over it, placements (resident, streamed, mixed), and runs of
// the decode engine over them.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "activekv/attention/attention_codecs.h"
#include "activekv/attention/quality.h"
#include "activekv/cuda/decode_engine.h"
#include "activekv/cuda/device_pages.h"
#include "activekv/cuda/pinned_memory.h"
#include "activekv/kv/codec.h"
#include "activekv/route/route.h"
#include "gpu_test_util.h"

namespace activekv::cuda {
namespace testing_routes {

// K with per-channel offsets and a few outlier channels (as real K has), V
// normal: the data the separable scale is for.
inline void fill_history(kv::SequenceKv& seq, const kv::KvShape& s, int64_t n, uint64_t seed) {
  std::mt19937 rng{uint32_t(seed)};
  std::normal_distribution<float> nd;
  const int row = s.n_kv_heads * s.head_dim;
  std::vector<float> gain(static_cast<size_t>(row), 1.f), mean(static_cast<size_t>(row));
  for (int i = 0; i < row; ++i) {
    mean[size_t(i)] = 0.5f * nd(rng);
    if (rng() % 16 == 0) gain[size_t(i)] = 20.f + float(rng() % 40);
  }
  std::vector<float> k(size_t(n) * row), v(k.size());
  seq.reserve(n);
  for (int l = 0; l < s.n_layers; ++l) {
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = (nd(rng) + mean[i % size_t(row)]) * gain[i % size_t(row)];
      v[i] = nd(rng) + mean[i % size_t(row)];
    }
    seq.write(l, 0, n, k.data(), v.data());
  }
  seq.commit(n);
}

inline std::vector<float> random_queries(size_t n, uint64_t seed) {
  std::mt19937 rng{uint32_t(seed)};
  std::normal_distribution<float> nd(0.f, 0.3f);
  std::vector<float> q(n);
  for (auto& x : q) x = nd(rng);
  return q;
}

// Where the pages of a batch lie for a run (the engine places page by page).
enum class Placement { resident, streamed, mixed };

inline const char* placement_name(Placement p) {
  return p == Placement::resident ? "resident" : p == Placement::streamed ? "streamed" : "mixed";
}

// Pages of a bounded store that holds every page of `lengths` tokens in `n_layers` layers.
inline size_t pages_for(const std::vector<int64_t>& lengths, int page_size, int n_layers) {
  size_t n = 0;
  for (int64_t len : lengths) n += size_t((len + page_size - 1) / page_size) * size_t(n_layers);
  return n;
}

struct RouteFixture {
  AttnShape sh;
  int L;
  std::vector<int64_t> lengths;
  int P;  // tokens per page
  kv::KvShape ks;
  // The one page store, pinned: the bf16 pages the history is written to are
  // the pages the engine streams, and encoded pages go to its arena. Bounded,
  // so each layer has a region and a (sequence, layer)'s pages are adjacent.
  kv::PageStore store{ks, pages_for(lengths, ks.page_size, L), &pinned_host_memory()};
  std::vector<std::unique_ptr<kv::SequenceKv>> seq;
  // [seq][layer][page]
  std::vector<std::vector<std::vector<PageRef>>> bf16, int8s, l13;
  std::vector<std::vector<std::vector<kv::EncodedPage>>> enc8, enc13;
  std::vector<float> q;

  /// `shape`'s pages, `layers` layers, sequences of `lens` tokens (default:
  /// 9 full pages and 17 tokens; 6 full pages).
  explicit RouteFixture(AttnShape shape = AttnShape{2, 3, 64, 64, 32, 0.f}, int layers = 2,
                        std::vector<int64_t> lens = {})
      : sh(shape),
        L(layers),
        lengths(lens.empty() ? std::vector<int64_t>{shape.page_size * 9 + 17, shape.page_size * 6} : lens),
        P(shape.page_size),
        ks{layers, shape.n_kv_heads, shape.head_dim, shape.page_size} {
    for (size_t s = 0; s < lengths.size(); ++s) {
      seq.push_back(std::make_unique<kv::SequenceKv>(store));
      fill_history(*seq.back(), ks, lengths[s], 100 + s);
    }
    const size_t S = lengths.size();
    bf16.resize(S); int8s.resize(S); l13.resize(S); enc8.resize(S); enc13.resize(S);
    for (size_t s = 0; s < S; ++s) {
      bf16[s].resize(L); int8s[s].resize(L); l13[s].resize(L); enc8[s].resize(L); enc13[s].resize(L);
      for (int l = 0; l < L; ++l) {
        const auto table = seq[s]->page_table(l);
        for (size_t p = 0; p < table.size(); ++p) {
          bf16[s][l].push_back(PageRef{store.page_data(table[p]), nullptr, sh.page_bytes(), PageKind::bf16});
          const int n = int(std::min<int64_t>(P, lengths[s] - int64_t(p) * P));
          if (n < P) continue;  // the tail stays exact
          enc8[s][l].push_back(kv::encode_page(kv::CodecFormat::int8s, store, table[p], n));
          enc13[s][l].push_back(kv::encode_page(kv::CodecFormat::lossless13, store, table[p], n));
        }
      }
    }
    // Encoded pages in the store's arena, page-ordered per (sequence, layer), as conversion would publish them.
    for (size_t s = 0; s < S; ++s)
      for (int l = 0; l < L; ++l)
        for (const auto& pair : {std::make_pair(&enc8, &int8s), std::make_pair(&enc13, &l13)})
          for (const auto& e : (*pair.first)[s][l]) {
            const kv::Blob b = store.blobs().allocate(e.bytes.size());
            std::memcpy(b.data, e.bytes.data(), e.bytes.size());
            (*pair.second)[s][l].push_back(
                PageRef{b.data, nullptr, b.bytes, pair.first == &enc8 ? PageKind::int8s : PageKind::lossless13});
          }
    q = random_queries(size_t(L) * S * sh.n_q_heads() * sh.head_dim, 5);
  }

  // Page p of a `full * P + tail`-token history read exact along `route`?
  // The CPU route planner decides, with every full page published.
  bool exact_page(const std::string& route, int64_t p, int64_t full) const {
    const route::RouteConfig cfg{route == "bf16" ? route::RouteKind::exact : route::parse_kind(route), 2, 32};
    const auto plan = route::plan_route(cfg, full * P + P - 1, P, [&](size_t q, route::ReadFormat) {
      return int64_t(q) < full;
    });
    return plan.page_format[size_t(p)] == route::ReadFormat::exact;
  }

  std::vector<SeqPages> tables(const std::string& route) const {
    std::vector<SeqPages> out(lengths.size());
    for (size_t s = 0; s < lengths.size(); ++s) {
      out[s].n_tokens = lengths[s];
      out[s].tables.resize(L);
      const int64_t np = (lengths[s] + P - 1) / P, full = lengths[s] / P;
      for (int l = 0; l < L; ++l)
        for (int64_t p = 0; p < np; ++p)
          out[s].tables[l].push_back(exact_page(route, p, full) ? bf16[s][l][p]
                                     : route == "lossless13"   ? l13[s][l][p]
                                                               : int8s[s][l][p]);
    }
    return out;
  }

  EngineConfig config(int tile_pages, Int8sKernelOptions k = {}) const {
    EngineConfig ec;
    ec.n_layers = L;
    ec.attn = sh;
    ec.tile_pages = tile_pages;
    ec.int8s = k;
    return ec;
  }

  // Runs two steps of `eng` (updated; a DecodeEngine or a ShardedDecodeEngine)
  // on the fixture's queries; returns O [L][S][nq][hd] then LSE [L][S][nq] appended, of the second.
  template <class Engine>
  std::vector<float> steps(Engine& eng) const {
    const size_t n = q.size(), nl = n / sh.head_dim;
    float *dq, *dout, *dlse;
    EXPECT_EQ(cudaSuccess, cudaMalloc(&dq, n * 4));
    EXPECT_EQ(cudaSuccess, cudaMalloc(&dout, n * 4));
    EXPECT_EQ(cudaSuccess, cudaMalloc(&dlse, nl * 4));
    EXPECT_EQ(cudaSuccess, cudaMemcpy(dq, q.data(), n * 4, cudaMemcpyHostToDevice));
    std::vector<float> out(n + nl);
    for (int step = 0; step < 2; ++step) {  // the second step reuses the ring
      eng.synchronize();
      EXPECT_EQ(cudaSuccess, cudaMemset(dout, 0xff, n * 4));  // poison (NaN): every output must be written
      EXPECT_EQ(cudaSuccess, cudaMemset(dlse, 0xff, nl * 4));
      EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());
      eng.enqueue_step(dq, dout, dlse);
    }
    eng.synchronize();
    EXPECT_EQ(cudaSuccess, cudaMemcpy(out.data(), dout, n * 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(cudaSuccess, cudaMemcpy(out.data() + n, dlse, nl * 4, cudaMemcpyDeviceToHost));
    cudaFree(dq); cudaFree(dout); cudaFree(dlse);
    return out;
  }

  // Device copies for every page of every format (placements other than streamed).
  std::unique_ptr<ResidentPages> device_copies() const {
    size_t slot = 0, n = 0;
    for (const auto* grid : {&bf16, &int8s, &l13})
      for (const auto& per_seq : *grid)
        for (const auto& table : per_seq)
          for (const PageRef& r : table) {
            slot = std::max<size_t>(slot, r.bytes);
            ++n;
          }
    return std::make_unique<ResidentPages>(slot, n);
  }

  // The route's batch placed as `p`, with device copies from `rp` (unused for streamed).
  std::vector<SeqPages> placed(const std::string& route, Placement p, ResidentPages* rp) const {
    std::vector<SeqPages> t = tables(route);
    if (p == Placement::streamed) return t;
    t = rp->place(t);
    if (p == Placement::mixed)  // a checkerboard over (sequence, layer, page)
      for (size_t s = 0; s < t.size(); ++s)
        for (size_t l = 0; l < t[s].tables.size(); ++l)
          for (size_t pg = 0; pg < t[s].tables[l].size(); ++pg)
            if ((s + l + pg) % 2) t[s].tables[l][pg].device = nullptr;
    return t;
  }

  // Runs two steps of the route's batch, placed as `p`, on a new engine; returns as steps().
  std::vector<float> run(const std::string& route, Placement p, int tile_pages, Int8sKernelOptions k = {}) const {
    std::unique_ptr<ResidentPages> rp;  // outlives the engine (destroyed after it)
    if (p != Placement::streamed) rp = device_copies();
    DecodeEngine eng(config(tile_pages, k));
    eng.update(placed(route, p, rp.get()));
    return steps(eng);
  }

  // Own-format error of `out` (from run) against fp64 over the route's dequantised history.
  double own_format_error(const std::string& route, const std::vector<float>& out) const {
    const int nq = sh.n_q_heads(), hd = sh.head_dim, S = int(lengths.size());
    double worst = 0;
    for (int l = 0; l < L; ++l)
      for (int s = 0; s < S; ++s) {
        attention::DenseHistoryF64 h;
        const auto table = seq[s]->page_table(l);
        const int64_t full = lengths[s] / P;
        for (size_t p = 0; p < table.size(); ++p) {
          const int n = int(std::min<int64_t>(P, lengths[s] - int64_t(p) * P));
          if (exact_page(route, int64_t(p), full)) h.append(store, table[p], n);
          else h.append(route == "lossless13" ? enc13[s][l][p] : enc8[s][l][p], n);
        }
        const int64_t pos = lengths[s] - 1;
        const float* qrow = q.data() + (size_t(l) * S + s) * nq * hd;
        const attention::QueryRows qr{qrow, 1, nq, &pos};
        attention::Partial got(1, nq, hd);
        std::memcpy(got.o.data(), out.data() + (size_t(l) * S + s) * nq * hd, size_t(nq) * hd * 4);
        std::memcpy(got.lse.data(), out.data() + q.size() + (size_t(l) * S + s) * nq, size_t(nq) * 4);
        worst = std::max(worst, attention::own_format_error(got, attention::reference_attention(h, qr, {})));
      }
    return worst;
  }
};

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

}  // namespace testing_routes
}  // namespace activekv::cuda
