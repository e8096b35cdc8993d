#include "activekv/cpu/prefill_attention.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "activekv/core/error.h"
#include "prefill_item.h"

namespace activekv::cpu {
namespace {

// Head rows per item: ~48 (three score tiles), whole rows of the group.
int rows_per_item(int group) { return std::max(1, 48 / group); }

bool use_avx2(PrefillIsa isa) {
  if (isa == PrefillIsa::portable) return false;
  if (isa == PrefillIsa::avx2 && !cpu_has_avx2_fma_kernels())
    throw InvalidArgument("cpu prefill attention: this CPU lacks AVX2/FMA");
  return cpu_has_avx2_fma_kernels();
}

void check(const DecodeShape& shape, std::span<const PageRef> pages, const PrefillRows& rows) {
  shape.validate();
  if (!prefill_kernels_support(shape)) {
    throw InvalidArgument(fmt::format("cpu prefill attention: head_dim {} is not a multiple of {}", shape.head_dim,
                                      detail::kPrefillTile));
  }
  for (size_t p = 0; p < pages.size(); ++p) {
    if (!pages[p].bf16_page || pages[p].int8s)
      throw InvalidArgument(fmt::format("cpu prefill attention: page {} is not a bf16 page", p));
    if (pages[p].n_tokens < 0 || pages[p].n_tokens > shape.page_size) {
      throw InvalidArgument(fmt::format("cpu prefill attention: page {} has {} tokens, outside [0, {}]", p,
                                        pages[p].n_tokens, shape.page_size));
    }
  }
  if (rows.n_rows < 0) throw InvalidArgument(fmt::format("cpu prefill attention: {} rows", rows.n_rows));
  if (rows.n_rows > 0 && (!rows.q || !rows.positions)) throw InvalidArgument("cpu prefill attention: no queries");
  if (rows.window < 0) throw InvalidArgument(fmt::format("cpu prefill attention: negative window {}", rows.window));
  for (int r = 0; r < rows.n_rows; ++r) {
    if (rows.positions[r] < 0)
      throw InvalidArgument(fmt::format("cpu prefill attention: row {} has position {}", r, rows.positions[r]));
  }
}

// O = acc / l, LSE = m + log l for the item's rows (empty head rows: 0, -inf).
void normalise(const detail::PrefillState& s, int n_rows, int group, int d, float* o, size_t o_stride, float* lse,
               size_t lse_stride) {
  for (int r = 0; r < n_rows; ++r) {
    for (int h = 0; h < group; ++h) {
      const size_t i = size_t(r) * group + size_t(h);
      float* out = o + size_t(r) * o_stride + size_t(h) * d;
      float& out_lse = lse[size_t(r) * lse_stride + size_t(h)];
      if (s.m[i] == -std::numeric_limits<float>::infinity() || s.l[i] == 0.0f) {
        std::fill(out, out + d, 0.0f);
        out_lse = -std::numeric_limits<float>::infinity();
        continue;
      }
      const float inv = 1.0f / s.l[i];
      for (int j = 0; j < d; ++j) out[j] = s.acc[i * size_t(d) + size_t(j)] * inv;
      out_lse = s.m[i] + std::log(s.l[i]);
    }
  }
}

}  // namespace

bool cpu_has_avx2_fma_kernels() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

bool prefill_kernels_support(const DecodeShape& shape) {
  return shape.n_kv_heads > 0 && shape.group > 0 && shape.page_size > 0 && shape.head_dim > 0 &&
         shape.head_dim % detail::kPrefillTile == 0;
}

void attend_prefill(const DecodeShape& shape, std::span<const PageRef> pages, int64_t first_token,
                    const PrefillRows& rows, const PrefillOptions& opt, PrefillWorkspace& ws, float* o, float* lse) {
  check(shape, pages, rows);
  const auto kernel = use_avx2(opt.isa) ? detail::prefill_item_avx2 : detail::prefill_item_portable;
  const int d = shape.head_dim, G = shape.group, H = shape.n_kv_heads, nq = shape.n_q_heads();
  const int rows_per = rows_per_item(G);
  const int n_blocks = (rows.n_rows + rows_per - 1) / rows_per;
  const size_t n_pages = pages.size();
  const size_t plane = size_t(shape.page_size) * d;
  ws.planes.resize(2 * size_t(H) * n_pages);
  ws.page_tokens.resize(n_pages);
  for (size_t p = 0; p < n_pages; ++p) {
    const auto* base = reinterpret_cast<const uint16_t*>(pages[p].bf16_page);
    ws.page_tokens[p] = pages[p].n_tokens;
    for (int g = 0; g < H; ++g) {
      ws.planes[(2 * size_t(g)) * n_pages + p] = base + size_t(g) * plane;
      ws.planes[(2 * size_t(g) + 1) * n_pages + p] = base + size_t(H + g) * plane;
    }
  }
  const int threads = opt.threads > 0 ? opt.threads : omp_get_max_threads();
  // Scratch sized here: an exception cannot leave the OpenMP region.
  ws.thread_f32.resize(size_t(threads));
  for (std::vector<float>& f : ws.thread_f32) f.resize(detail::prefill_scratch(rows_per * G, d).total);
  const float scale = shape.softmax_scale != 0.0f ? shape.softmax_scale : 1.0f / std::sqrt(float(d));
  const int n_items = H * n_blocks;
  // Items are independent and each computed serially: the schedule changes no bit.
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int item = 0; item < n_items; ++item) {
    const int g = item % H, r0 = item / H * rows_per;
    const int n = std::min(rows_per, rows.n_rows - r0);
    float* scratch = ws.thread_f32[size_t(omp_get_thread_num())].data();
    detail::PrefillItem it;
    it.k = ws.planes.data() + 2 * size_t(g) * n_pages;
    it.v = ws.planes.data() + (2 * size_t(g) + 1) * n_pages;
    it.page_tokens = ws.page_tokens.data();
    it.n_pages = int(n_pages);
    it.page_size = shape.page_size;
    it.first_token = first_token;
    it.group = G;
    it.d = d;
    it.scale = scale;
    it.window = rows.window;
    it.n_rows = n;
    it.positions = rows.positions + r0;
    it.q = rows.q + (size_t(r0) * nq + size_t(g) * G) * d;
    it.q_stride = size_t(nq) * d;
    it.scratch = scratch;
    kernel(it);
    normalise(detail::prefill_state(scratch, n * G, d), n, G, d, o + (size_t(r0) * nq + size_t(g) * G) * d,
              size_t(nq) * d, lse + size_t(r0) * nq + size_t(g) * G, size_t(nq));
  }
}

attention::Partial attend_prefill(const DecodeShape& shape, std::span<const PageRef> pages, int64_t first_token,
                                  const PrefillRows& rows, const PrefillOptions& opt) {
  check(shape, pages, rows);
  PrefillWorkspace ws;
  attention::Partial out(rows.n_rows, shape.n_q_heads(), shape.head_dim);
  attend_prefill(shape, pages, first_token, rows, opt, ws, out.o.data(), out.lse.data());
  return out;
}

}  // namespace activekv::cpu
