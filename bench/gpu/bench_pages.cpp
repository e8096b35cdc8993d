// The bench's host history in every format. See bench_pages.h.
#include "bench_pages.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <span>

#include "activekv/cuda/pinned_memory.h"
#include "activekv/kv/codec.h"
#include "activekv/kv/codec_lossless13.h"
#include "activekv/route/route.h"
#include "bench_util.h"

namespace activekv::gpu_bench {
namespace {

// Encodes the full pages of every (sequence, layer) of `bf16` to `f` into
// the store's arena, in page order; returns the refs and fills the timing.
PageGrid encode_all(kv::PageStore& store, const PageGrid& bf16, const AttnShape& sh, int64_t full_pages,
                    kv::CodecFormat f, PageKind kind, int threads, HistorySet::Conversion& conv) {
  const kv::KvShape ks{1, sh.n_kv_heads, sh.head_dim, sh.page_size};
  PageGrid out(bf16.size());
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<kv::EncodedPage> enc(static_cast<size_t>(full_pages));
  for (size_t s = 0; s < bf16.size(); ++s) {
    out[s].resize(bf16[s].size());
    for (size_t l = 0; l < bf16[s].size(); ++l) {
      parallel_for(size_t(full_pages), threads, [&](size_t p) {
        const auto* page = reinterpret_cast<const activekv::bf16*>(bf16[s][l][p].host);
        enc[p] = kv::encode_page(f, ks, std::span<const activekv::bf16>(page, ks.page_elements()), sh.page_size);
      });
      for (const kv::EncodedPage& e : enc) {
        const kv::Blob b = store.blobs().allocate(e.bytes.size());  // 256-byte aligned, after the previous one
        std::memcpy(b.data, e.bytes.data(), e.bytes.size());
        out[s][l].push_back(PageRef{b.data, nullptr, b.bytes, kind});
      }
      conv.pages += size_t(full_pages);
    }
  }
  conv.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  conv.threads = threads;
  std::printf("  %s: %zu pages encoded in %.2f s on %d host threads (%.0f pages/s)\n", kv::codec_name(f).c_str(),
              conv.pages, conv.seconds, threads, double(conv.pages) / conv.seconds);
  std::fflush(stdout);
  return out;
}

}  // namespace

HistorySet build_history(const AttnShape& sh, int n_layers, int max_batch, int64_t max_ctx, bool want_int8s,
                         bool want_lossless13, int threads) {
  const kv::KvShape ks{1, sh.n_kv_heads, sh.head_dim, sh.page_size};
  const int64_t np = (max_ctx + sh.page_size - 1) / sh.page_size, full = max_ctx / sh.page_size;
  const size_t n_pages = size_t(np) * n_layers * max_batch, n_full = size_t(full) * n_layers * max_batch;
  const size_t pad = 256;
  size_t extra = 0;
  if (want_int8s) extra += n_full * (kv::encoded_page_bytes(kv::CodecFormat::int8s, ks) + pad);
  if (want_lossless13) extra += n_full * (kv::lossless13_raw_page_bytes(ks) + pad);
  std::printf("  pinning %.2f GiB of host history (bf16 %.2f GiB + encoded pages %.2f GiB)...\n",
              double(n_pages * sh.page_bytes() + extra) / double(1ull << 30),
              double(n_pages * sh.page_bytes()) / double(1ull << 30), double(extra) / double(1ull << 30));
  std::fflush(stdout);
  HistorySet h;
  // Bounded: one pinned slab, a region per layer. Allocated sequence by
  // sequence, layer by layer, page by page, so each (sequence, layer)'s pages
  // are adjacent (one copy per tile, as the runtime's history would be).
  h.store = std::make_unique<kv::PageStore>(kv::KvShape{n_layers, sh.n_kv_heads, sh.head_dim, sh.page_size}, n_pages,
                                            &cuda::pinned_host_memory());
  h.bf16.assign(size_t(max_batch), std::vector<std::vector<PageRef>>(size_t(n_layers)));
  std::vector<std::byte*> pages;
  pages.reserve(n_pages);
  for (int s = 0; s < max_batch; ++s)
    for (int l = 0; l < n_layers; ++l)
      for (int64_t p = 0; p < np; ++p) {
        pages.push_back(h.store->page_data(h.store->allocate(l)));
        h.bf16[s][l].push_back(PageRef{pages.back(), nullptr, sh.page_bytes(), PageKind::bf16});
      }
  parallel_for(n_pages, threads, [&](size_t i) { fill_random_bf16(pages[i], sh.page_bytes(), 42 + i, 1); });
  if (want_int8s)
    h.int8s = encode_all(*h.store, h.bf16, sh, full, kv::CodecFormat::int8s, PageKind::int8s, threads, h.int8s_conv);
  if (want_lossless13)
    h.lossless13 = encode_all(*h.store, h.bf16, sh, full, kv::CodecFormat::lossless13, PageKind::lossless13, threads,
                              h.lossless13_conv);
  return h;
}

const std::vector<std::string>& route_names() {
  static const std::vector<std::string> names{"bf16", "lossless13", "int8s", "hybrid"};
  return names;
}

std::vector<SeqPages> route_tables(const HistorySet& h, const std::string& route, int batch, int64_t ctx,
                                   int n_layers, int page_size, int recent_pages) {
  if (std::find(route_names().begin(), route_names().end(), route) == route_names().end())
    throw InvalidArgument("bench decode: unknown --kv-format '" + route + "' (bf16, lossless13, int8s, hybrid)");
  const PageGrid* enc = route == "lossless13" ? &h.lossless13 : (route == "bf16" ? nullptr : &h.int8s);
  if (enc && enc->empty()) throw InvalidArgument("bench decode: " + route + " pages were not built");
  // The CPU route planner decides which page is read how (every full page is
  // published here, as after conversion has caught up); the bench only maps
  // its formats to the store's pages.
  const route::RouteConfig cfg{route == "bf16" ? route::RouteKind::exact : route::parse_kind(route), recent_pages, 32};
  const int64_t full = ctx / page_size;
  const route::RoutePlan plan =
      route::plan_route(cfg, ctx, page_size, [&](size_t p, route::ReadFormat) { return int64_t(p) < full; });
  std::vector<SeqPages> seqs(static_cast<size_t>(batch));
  for (int s = 0; s < batch; ++s) {
    seqs[s].n_tokens = ctx;
    seqs[s].tables.resize(size_t(n_layers));
    for (int l = 0; l < n_layers; ++l)
      for (size_t p = 0; p < plan.page_format.size(); ++p)
        seqs[s].tables[l].push_back(plan.page_format[p] == route::ReadFormat::exact ? h.bf16[s][l][p]
                                                                                    : (*enc)[s][l][p]);
  }
  return seqs;
}

}  // namespace activekv::gpu_bench
