// CPU decode attention (decode_attention.h): argument checks, the work list
// (page splits x KV heads), the OpenMP loop and the ordered merge. The
// kernels are in kernels_avx512.cpp and kernels_portable.cpp.
#include "activekv/cpu/decode_attention.h"

#include <fmt/format.h>
#include <omp.h>
#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "activekv/attention/int8s_query.h"
#include "activekv/core/error.h"
#include "kernels.h"

namespace activekv::cpu {
namespace {

// One work item: split `split` (global, token order) = tokens [tok0, tok0 + n)
// of page `page`, for every KV head.
struct Split {
  size_t page;
  int tok0, n;
};

void check(const DecodeShape& shape, std::span<const PageRef> pages, const CpuAttentionOptions& opt) {
  shape.validate();
  if (opt.split_tokens <= 0) throw InvalidArgument(fmt::format("cpu attention: split_tokens {} is not positive", opt.split_tokens));
  if (opt.int8s_query_terms != 1 && opt.int8s_query_terms != 2) {
    throw InvalidArgument(fmt::format("cpu attention: int8s_query_terms {} is not 1 or 2", opt.int8s_query_terms));
  }
  if (opt.threads < 0) throw InvalidArgument(fmt::format("cpu attention: threads {} is negative", opt.threads));
  for (size_t i = 0; i < pages.size(); ++i) {
    const PageRef& p = pages[i];
    if ((p.bf16_page == nullptr) == (p.int8s == nullptr)) {
      throw InvalidArgument(fmt::format("cpu attention: page {} must name exactly one of a bf16 page and an int8s view", i));
    }
    if (p.n_tokens < 0 || p.n_tokens > shape.page_size) {
      throw InvalidArgument(fmt::format("cpu attention: page {} asks for {} tokens, outside [0, {}]", i, p.n_tokens,
                                        shape.page_size));
    }
    if (p.int8s) {
      const kv::PageHeader& h = p.int8s->header;
      if (h.n_kv_heads != shape.n_kv_heads || h.head_dim != shape.head_dim || h.page_size != shape.page_size) {
        throw InvalidArgument(fmt::format(
            "cpu attention: int8s page {} is ({} KV heads, head_dim {}, page_size {}), the shape is ({}, {}, {})", i,
            h.n_kv_heads, h.head_dim, h.page_size, shape.n_kv_heads, shape.head_dim, shape.page_size));
      }
      if (h.n_tokens < p.n_tokens) {
        throw InvalidArgument(fmt::format("cpu attention: int8s page {} holds {} tokens, {} asked", i, h.n_tokens,
                                          p.n_tokens));
      }
    }
  }
}

/// Whether the AMX kernels run (q.k and P.V on the tile unit; on top of the AVX-512 kernels).
// page_size <= 65536: int8s P.V sums n x 255 x 127 per digit in int32 (kernels_amx.cpp).
bool use_amx(const DecodeShape& shape, Isa isa) {
  const bool shape_ok =
      shape.head_dim % 64 == 0 && shape.head_dim <= 512 && shape.group <= 8 && shape.page_size <= 65536;
  if (isa == Isa::amx) {
    if (!cpu_has_amx_kernels())
      throw InvalidArgument("cpu attention: this CPU or OS gives no AMX tiles (AMX-TILE, AMX-BF16, AMX-INT8, AVX512-VBMI and the tile state)");
    if (!shape_ok) {
      throw InvalidArgument(fmt::format("cpu attention: the AMX kernel needs head_dim % 64 == 0, head_dim <= 512, "
                                        "group <= 8 and page_size <= 65536 (head_dim {}, group {}, page_size {})",
                                        shape.head_dim, shape.group, shape.page_size));
    }
    return true;
  }
  return isa == Isa::automatic && shape_ok && cpu_has_amx_kernels();
}

bool use_avx512(const DecodeShape& shape, Isa isa) {
  const bool shape_ok = shape.head_dim % 64 == 0 && shape.group <= 8;
  if (isa == Isa::portable) return false;
  if (isa == Isa::amx) return use_amx(shape, isa);
  if (isa == Isa::avx512) {
    if (!cpu_has_avx512_kernels()) throw InvalidArgument("cpu attention: this CPU lacks AVX-512 BF16/VNNI");
    if (!shape_ok) {
      throw InvalidArgument(fmt::format("cpu attention: the AVX-512 kernels need head_dim % 64 == 0 and group <= 8 "
                                        "(head_dim {}, group {})", shape.head_dim, shape.group));
    }
    return true;
  }
  return shape_ok && cpu_has_avx512_kernels();
}

std::vector<Split> make_splits(std::span<const PageRef> pages, int split_tokens) {
  std::vector<Split> splits;
  for (size_t p = 0; p < pages.size(); ++p) {
    for (int t0 = 0; t0 < pages[p].n_tokens; t0 += split_tokens) {
      splits.push_back({p, t0, std::min(split_tokens, pages[p].n_tokens - t0)});
    }
  }
  return splits;
}

// The bf16 query terms for the AVX-512 kernel: hi = bf16(q), lo = bf16(q - hi).
void split_query_bf16(const float* q, size_t n, std::vector<uint16_t>& out) {
  out.resize(2 * n);
  for (size_t i = 0; i < n; ++i) {
    const bf16 hi = f32_to_bf16(q[i]);
    out[i] = hi.bits;
    out[n + i] = f32_to_bf16(q[i] - bf16_to_f32(hi)).bits;
  }
}

// Everything one thread needs for one item.
struct ItemContext {
  const DecodeShape& shape;
  const float* q;
  const uint16_t* q_hi;
  const uint16_t* q_lo;
  uint16_t* q_tiles;  // AMX: KV head g's packed query at q_tiles + g * amx_query_elems(d); else null
  float scale;
  int terms;
  detail::Bf16Kernel bf16_kernel;
  detail::Int8sKernel int8s_kernel;
};

// Tokens of the next item whose rows a kernel prefetches: the two 32-token
// blocks the AMX kernel's own prefetch (two blocks ahead) never reaches.
constexpr int kNextTokens = 64;

// The first rows of item (split s, KV head g) of `page`.
detail::NextRows first_rows(const DecodeShape& shape, const PageRef& page, const Split& s, int g) {
  const int d = shape.head_dim, n = std::min(s.n, kNextTokens);
  if (page.int8s) {
    const kv::Int8sHeadView hv = page.int8s->head(g);
    return {reinterpret_cast<const char*>(hv.kq + size_t(s.tok0) * d),
            reinterpret_cast<const char*>(hv.vq + size_t(s.tok0) * d), n * d};
  }
  const size_t plane = size_t(shape.page_size) * d;
  const auto* base = reinterpret_cast<const uint16_t*>(page.bf16_page);
  return {reinterpret_cast<const char*>(base + size_t(g) * plane + size_t(s.tok0) * d),
          reinterpret_cast<const char*>(base + size_t(shape.n_kv_heads + g) * plane + size_t(s.tok0) * d),
          2 * n * d};
}

// pv_tiles: the thread's AMX P.V scratch (null off AMX); next: the thread's next item's first rows.
void run_bf16_item(const ItemContext& c, const PageRef& page, const Split& s, int g, float* scores,
                   uint16_t* pv_tiles, detail::NextRows next, float* o, float* lse) {
  const int d = c.shape.head_dim, G = c.shape.group;
  const size_t plane = size_t(c.shape.page_size) * d;
  const auto* base = reinterpret_cast<const uint16_t*>(page.bf16_page);
  detail::Bf16Item it;
  it.k = base + size_t(g) * plane + size_t(s.tok0) * d;
  it.v = base + size_t(c.shape.n_kv_heads + g) * plane + size_t(s.tok0) * d;
  it.n = s.n;
  it.q = c.q + size_t(g) * G * d;
  it.q_hi = c.q_hi + size_t(g) * G * d;
  it.q_lo = c.q_lo + size_t(g) * G * d;
  if (c.q_tiles != nullptr) it.q_tiles = c.q_tiles + size_t(g) * detail::amx_query_elems(d);
  it.pv_tiles = pv_tiles;
  it.next = next;
  c.bf16_kernel(it, G, d, c.scale, scores, o, lse);
}

// The int8s query of one (page, KV head), shared by the page's splits
// (int8s_query.h): i8 [2][G][d] codes (qq, then qq_lo); f32 [G] row scales
// (a_h * softmax_scale), then [d] value scales. `scratch`: 3d floats.
struct PageQuery {
  int8_t* i8;
  float* f32;
};

void prepare_int8s_query(const ItemContext& c, const kv::Int8sPageView& page, int g, PageQuery out, float* scratch) {
  const int d = c.shape.head_dim, G = c.shape.group;
  const kv::Int8sHeadView hv = page.head(g);
  float* cs = scratch;
  float* qp = scratch + d;
  float* residual = scratch + 2 * d;
  kv::fp16_to_f32(hv.c_fp16, size_t(d), cs);
  for (int h = 0; h < G; ++h) {
    const float a = attention::quantise_int8s_query(c.q + (size_t(g) * G + h) * d, cs, d, c.terms, qp, residual,
                                                    out.i8 + size_t(h) * d, out.i8 + (size_t(G) + h) * d);
    out.f32[h] = a * c.scale;
  }
  kv::fp16_to_f32(hv.v_fp16, size_t(d), out.f32 + G);
}

// f32 scratch: [G * split] scores, then [split] token scales.
void run_int8s_item(const ItemContext& c, const PageRef& page, const Split& s, int g, PageQuery pq, float* f32,
                    uint16_t* pv_tiles, detail::NextRows next, float* o, float* lse) {
  const int d = c.shape.head_dim, G = c.shape.group;
  const kv::Int8sHeadView hv = page.int8s->head(g);
  float* scores = f32;
  float* ts = scores + size_t(G) * s.n;
  kv::fp16_to_f32(hv.s_fp16 + 2 * size_t(s.tok0), size_t(s.n), ts);
  detail::Int8sItem it;
  it.kq = hv.kq + size_t(s.tok0) * d;
  it.vq = hv.vq + size_t(s.tok0) * d;
  it.n = s.n;
  it.s = ts;
  it.vscale = pq.f32 + G;
  it.qq = pq.i8;
  it.qq_lo = pq.i8 + size_t(G) * d;
  it.row_scale = pq.f32;
  it.terms = c.terms;
  it.pv_tiles = pv_tiles;
  it.next = next;
  c.int8s_kernel(it, G, d, scores, o, lse);
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512: return "avx512";
    case Isa::portable: return "portable";
    case Isa::amx: return "amx";
    default: return "automatic";
  }
}

bool cpu_has_avx512_kernels() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vnni");
  return has;
#else
  return false;
#endif
}

const char* kernels_name(const DecodeShape& shape, Isa isa) {
  if (use_amx(shape, isa)) return "amx (q.k, P.V), avx512";
  return use_avx512(shape, isa) ? "avx512" : "portable";
}

bool cpu_has_amx_kernels() {
#if defined(__x86_64__) && defined(__linux__)
  static const bool has = [] {
    if (!cpu_has_avx512_kernels()) return false;
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool amx_bf16 = (d >> 22) & 1u, amx_tile = (d >> 24) & 1u, amx_int8 = (d >> 25) & 1u;
    const bool vbmi = (c >> 1) & 1u;  // the int8s value quads' byte permutes (every AMX CPU has it)
    if (!amx_bf16 || !amx_tile || !amx_int8 || !vbmi) return false;
    // Linux keeps the 8 KiB tile state off until a process asks for it.
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return has;
#else
  return false;
#endif
}

void DecodeShape::validate() const {
  const auto positive = [](int v, const char* name) {
    if (v <= 0) throw InvalidArgument(fmt::format("cpu attention: {} {} is not positive", name, v));
  };
  positive(n_kv_heads, "n_kv_heads");
  positive(group, "group");
  positive(head_dim, "head_dim");
  positive(page_size, "page_size");
}

size_t history_bytes(const DecodeShape& shape, std::span<const PageRef> pages) {
  size_t bytes = 0;
  for (const PageRef& p : pages) {
    const size_t per_token = p.int8s ? 2 * size_t(shape.head_dim) + 2 : 4 * size_t(shape.head_dim);
    bytes += per_token * size_t(shape.n_kv_heads) * size_t(p.n_tokens);
  }
  return bytes;
}

size_t count_splits(std::span<const PageRef> pages, int split_tokens) {
  if (split_tokens <= 0) throw InvalidArgument(fmt::format("cpu attention: split_tokens {} is not positive", split_tokens));
  size_t n = 0;
  for (const PageRef& p : pages) n += size_t((std::max(p.n_tokens, 0) + split_tokens - 1) / split_tokens);
  return n;
}

size_t attend_pages_splits(const DecodeShape& shape, std::span<const PageRef> pages, const float* q,
                           const CpuAttentionOptions& opt, CpuAttentionWorkspace& ws, float* split_o,
                           float* split_lse) {
  check(shape, pages, opt);
  const int d = shape.head_dim, G = shape.group, H = shape.n_kv_heads, nq = shape.n_q_heads();
  const bool avx512 = use_avx512(shape, opt.isa);
  const bool amx = use_amx(shape, opt.isa);
  const std::vector<Split> splits = make_splits(pages, opt.split_tokens);
  if (splits.empty()) return 0;
  if (avx512) split_query_bf16(q, size_t(nq) * d, ws.q_bf16);
  static const detail::Bf16Kernel bf16_portable = detail::pick_bf16_portable();
  static const detail::Int8sKernel int8s_portable = detail::pick_int8s_portable();
  uint16_t* q_tiles = nullptr;  // packed once per KV head and call, not per item (kernels_amx.cpp)
  const bool any_bf16 = std::any_of(pages.begin(), pages.end(), [](const PageRef& p) { return p.int8s == nullptr; });
  if (amx && any_bf16) {
    ws.q_amx.resize(size_t(H) * detail::amx_query_elems(d) + 32);
    const auto addr = reinterpret_cast<uintptr_t>(ws.q_amx.data());
    q_tiles = ws.q_amx.data() + (64 - addr % 64) % 64 / sizeof(uint16_t);  // 64-byte aligned
  }
  const ItemContext ctx{shape,
                        q,
                        avx512 ? ws.q_bf16.data() : nullptr,
                        avx512 ? ws.q_bf16.data() + size_t(nq) * d : nullptr,
                        q_tiles,
                        shape.softmax_scale != 0.0f ? shape.softmax_scale : 1.0f / std::sqrt(float(d)),
                        opt.int8s_query_terms,
                        amx      ? detail::bf16_item_amx
                        : avx512 ? detail::bf16_item_avx512
                                 : bf16_portable,
                        amx      ? detail::int8s_item_amx
                        : avx512 ? detail::int8s_item_avx512
                                 : int8s_portable};

  // Per-page int8s query slots: page p's (page, KV head) g at query_slot[p] * H + g.
  std::vector<int>& query_slot = ws.query_slot;
  query_slot.assign(pages.size(), -1);
  int n_int8s = 0;
  for (size_t p = 0; p < pages.size(); ++p) {
    if (pages[p].int8s && pages[p].n_tokens > 0) query_slot[p] = n_int8s++;
  }
  const size_t q_i8 = 2 * size_t(G) * d, q_f32 = size_t(G) + d;
  ws.query_i8.resize(size_t(n_int8s) * H * q_i8);
  ws.query_f32.resize(size_t(n_int8s) * H * q_f32);
  const auto page_query = [&](size_t p, int g) {
    const size_t slot = size_t(query_slot[p]) * H + size_t(g);
    return PageQuery{ws.query_i8.data() + slot * q_i8, ws.query_f32.data() + slot * q_f32};
  };
  const int threads = opt.threads > 0 ? opt.threads : omp_get_max_threads();
  const int split_cap = std::min(opt.split_tokens, shape.page_size);
  // Scratch sized here, not in the parallel region: an exception (bad_alloc)
  // cannot leave an OpenMP region -- it would end the process, where here it
  // reaches the caller (the engine's CPU share keeps it for the step).
  ws.thread_f32.resize(size_t(threads));
  for (std::vector<float>& f32 : ws.thread_f32) f32.resize(std::max(size_t(G + 1) * split_cap, 3 * size_t(d)));
  ws.thread_amx.resize(amx ? size_t(threads) : 0);
  for (std::vector<uint16_t>& t : ws.thread_amx) t.resize(detail::amx_pv_scratch_elems(G, d, split_cap) + 32);
  const int n_items = int(splits.size()) * H;
  std::atomic<int> next_item{0};
#pragma omp parallel num_threads(threads)
  {
    std::vector<float>& f32 = ws.thread_f32[size_t(omp_get_thread_num())];
    uint16_t* pv_tiles = nullptr;  // 64-byte aligned (tile loads and stores of whole rows)
    if (amx) {
      std::vector<uint16_t>& t = ws.thread_amx[size_t(omp_get_thread_num())];
      pv_tiles = t.data() + (64 - reinterpret_cast<uintptr_t>(t.data()) % 64) % 64 / sizeof(uint16_t);
    }
    // The AMX query of each KV head and the int8s query of each (page, KV
    // head) once, before their items.
    if (ctx.q_tiles != nullptr) {
#pragma omp for schedule(static)
      for (int g = 0; g < H; ++g)
        detail::pack_query_amx(ctx.q_hi + size_t(g) * G * d, ctx.q_lo + size_t(g) * G * d, G, d,
                               ctx.q_tiles + size_t(g) * detail::amx_query_elems(d));
    }
#pragma omp for schedule(static)
    for (int i = 0; i < int(pages.size()) * H; ++i) {
      const size_t p = size_t(i / H);
      if (query_slot[p] >= 0) prepare_int8s_query(ctx, *pages[p].int8s, i % H, page_query(p, i % H), f32.data());
    }
    // Items are independent and each is computed serially, so the order
    // and the thread that takes an item do not change a bit of the result.
    // Each thread claims its next item before it starts this one (a shared
    // counter: dynamic, as threads finish), so the kernel can prefetch the
    // next item's first rows while it computes from the cache.
    int item = next_item.fetch_add(1, std::memory_order_relaxed);
    while (item < n_items) {
      const int next = next_item.fetch_add(1, std::memory_order_relaxed);
      const Split& s = splits[size_t(item / H)];
      const int g = item % H;
      const PageRef& page = pages[s.page];
      float* so = split_o + (size_t(item / H) * nq + size_t(g) * G) * d;
      float* sl = split_lse + size_t(item / H) * nq + size_t(g) * G;
      const detail::NextRows hint =  // read by the AMX kernels only
          amx && next < n_items
              ? first_rows(shape, pages[splits[size_t(next / H)].page], splits[size_t(next / H)], next % H)
              : detail::NextRows{};
      if (page.int8s) {
        run_int8s_item(ctx, page, s, g, page_query(s.page, g), f32.data(), pv_tiles, hint, so, sl);
      } else {
        run_bf16_item(ctx, page, s, g, f32.data(), pv_tiles, hint, so, sl);
      }
      item = next;
    }
  }
  return splits.size();
}

void attend_pages(const DecodeShape& shape, std::span<const PageRef> pages, const float* q,
                  const CpuAttentionOptions& opt, CpuAttentionWorkspace& ws, float* o, float* lse) {
  check(shape, pages, opt);
  const int d = shape.head_dim, nq = shape.n_q_heads();
  const size_t n_splits = count_splits(pages, opt.split_tokens);
  if (n_splits == 0) {
    std::fill(o, o + size_t(nq) * d, 0.0f);
    std::fill(lse, lse + nq, -std::numeric_limits<float>::infinity());
    return;
  }
  ws.split_o.resize(n_splits * nq * d);
  ws.split_lse.resize(n_splits * nq);
  attend_pages_splits(shape, pages, q, opt, ws, ws.split_o.data(), ws.split_lse.data());
  const SplitRange all{0, n_splits};
  merge_split_ranges(shape, {&all, 1}, ws.split_o.data(), ws.split_lse.data(), opt.threads, ws);
  std::copy(ws.split_o.begin(), ws.split_o.begin() + ptrdiff_t(nq) * d, o);
  std::copy(ws.split_lse.begin(), ws.split_lse.begin() + nq, lse);
}

void merge_split_ranges(const DecodeShape& shape, std::span<const SplitRange> ranges, float* split_o,
                        float* split_lse, int threads, CpuAttentionWorkspace& ws) {
  shape.validate();
  const size_t d = size_t(shape.head_dim), nq = size_t(shape.n_q_heads());
  size_t most = 0;
  for (const SplitRange& r : ranges) most = std::max(most, r.count);
  if (most < 2) return;  // nothing to merge
  const int n_tasks = int(ranges.size() * nq);
  threads = std::min(threads > 0 ? threads : omp_get_max_threads(), n_tasks);
  // Scratch sized here: an exception cannot leave the parallel region.
  ws.thread_merge.resize(size_t(threads));
  for (CpuAttentionWorkspace::MergeScratch& m : ws.thread_merge) {
    m.o.resize(most);
    m.lse.resize(most);
    m.out.resize(d);
  }
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int t = 0; t < n_tasks; ++t) {
    const SplitRange& r = ranges[size_t(t) / nq];
    if (r.count < 2) continue;
    const size_t h = size_t(t) % nq;
    CpuAttentionWorkspace::MergeScratch& m = ws.thread_merge[size_t(omp_get_thread_num())];
    for (size_t i = 0; i < r.count; ++i) {
      m.o[i] = split_o + ((r.first + i) * nq + h) * d;
      m.lse[i] = split_lse[(r.first + i) * nq + h];
    }
    // Into scratch first: the first row is one of the inputs.
    const float l = attention::merge_states({m.o.data(), r.count}, {m.lse.data(), r.count}, int(d), m.out.data());
    std::copy(m.out.begin(), m.out.end(), split_o + (r.first * nq + h) * d);
    split_lse[r.first * nq + h] = l;
  }
}

attention::Partial attend_pages(const DecodeShape& shape, std::span<const PageRef> pages, const float* q,
                                const CpuAttentionOptions& opt) {
  shape.validate();
  CpuAttentionWorkspace ws;
  attention::Partial out(1, shape.n_q_heads(), shape.head_dim);
  attend_pages(shape, pages, q, opt, ws, out.o.data(), out.lse.data());
  return out;
}

}  // namespace activekv::cpu
