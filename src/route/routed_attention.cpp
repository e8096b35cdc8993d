#include "activekv/route/routed_attention.h"

#include <algorithm>
#include <vector>

#include "activekv/attention/attention_codecs.h"
#include "activekv/cpu/decode_attention.h"
#include "activekv/cpu/prefill_attention.h"
#include "activekv/kv/codec_lossless13.h"

namespace activekv::route {
namespace {

kv::CodecFormat codec_of(ReadFormat f) {
  return f == ReadFormat::lossless13 ? kv::CodecFormat::lossless13 : kv::CodecFormat::int8s;
}

// Supplies lossless13 pages of a bf16 segment to the bf16 kernel: each
// (page, KV head) request unpacks the two planes straight into the kernel's
// fp32 workspace from the view validated at publication -- no allocation,
// no validation, no bf16 copy of the page.
class Lossless13Reader {
 public:
  Lossless13Reader(const convert::CompressedHistory* c, int layer, const RoutePlan& plan)
      : compressed_(c), layer_(layer), plan_(plan) {}

  bool operator()(size_t page, int kv_head, int n_keys, float* k, float* v) const {
    if (plan_.page_format[page] != ReadFormat::lossless13) return false;
    attention::read_lossless13_planes(*compressed_->lossless13_view(layer_, page), kv_head, n_keys, k, v);
    return true;
  }

 private:
  const convert::CompressedHistory* compressed_;
  int layer_;
  const RoutePlan& plan_;
};

attention::Partial attend_int8s_segment(const attention::LayerHistory& history, int layer,
                                        const RoutedView& view, const Segment& seg,
                                        const attention::QueryRows& q, const attention::AttentionOptions& opt) {
  const int64_t first_token = int64_t(seg.first_page) * history.store->shape().page_size;
  // The kernels read the views validated at publication.
  std::vector<kv::Int8sPageView> pages;
  pages.reserve(seg.n_pages);
  for (size_t p = seg.first_page; p < seg.first_page + seg.n_pages; ++p) {
    pages.push_back(*view.compressed->int8s_view(layer, p));
    if (view.report) view.report->bytes += double(pages.back().blob.size());
  }
  const std::span<const kv::Int8sPageView> views(pages);
  if (view.int8s_tile) {  // e.g. the GPU
    // Its contract has no sliding window: refuse rather than attend too far back.
    if (opt.window > 0) throw InvalidArgument("routed attention: the injected int8s tile kernel has no sliding window");
    return view.int8s_tile(views, first_token, history.n_tokens, q, opt);
  }
  return attention::attend_int8s_tile(views, first_token, history.n_tokens, q, opt);
}

// RoutedView::cpu_attention_kernels: whether the rows and pages qualify (the
// history as the caller gave it: no plane reader of its own, bf16 pages).
bool in_place_pages(const attention::LayerHistory& h) {
  return !h.read_planes && h.store->shape().format == kv::PageFormat::bf16;
}

bool in_place_decode(const attention::LayerHistory& h, const attention::QueryRows& q,
                     const attention::AttentionOptions& opt) {
  return q.n_rows == 1 && q.positions[0] == h.n_tokens - 1 && opt.window == 0 && in_place_pages(h);
}

bool in_place_prefill(const attention::LayerHistory& h, const attention::QueryRows& q) {
  if (q.n_rows < 2 || !in_place_pages(h)) return false;
  const kv::KvShape& s = h.store->shape();
  if (q.n_heads % s.n_kv_heads != 0) return false;  // attend_tile names the error
  for (int r = 0; r < q.n_rows; ++r) {
    if (q.positions[r] < 0 || q.positions[r] >= h.n_tokens) return false;  // likewise
  }
  return cpu::prefill_kernels_support({s.n_kv_heads, q.n_heads / s.n_kv_heads, s.head_dim, s.page_size, 0.0f});
}

// The bf16 segment [seg.first_page, + n_pages) as the in-place kernels read
// it: exact pages where they lie; lossless13 pages unpacked (bit-exact) into
// bf16 scratch in the PageStore layout, so that the lossless13 route gives
// the exact route's bits here too (route.h). Per calling thread, reused
// across layers and steps.
std::span<const cpu::PageRef> bf16_page_refs(const attention::LayerHistory& h, int layer, const RoutedView& view,
                                             const RoutePlan& plan, const Segment& seg) {
  const kv::KvShape& s = h.store->shape();
  static thread_local std::vector<bf16> unpacked;
  static thread_local std::vector<cpu::PageRef> pages;
  size_t n_l13 = 0;
  for (size_t p = seg.first_page; p < seg.first_page + seg.n_pages; ++p)
    n_l13 += plan.page_format[p] == ReadFormat::lossless13 ? 1 : 0;
  if (unpacked.size() < n_l13 * s.page_elements()) unpacked.resize(n_l13 * s.page_elements());
  pages.clear();
  size_t slot = 0;
  for (size_t p = seg.first_page; p < seg.first_page + seg.n_pages; ++p) {
    const int n = int(std::min<int64_t>(s.page_size, h.n_tokens - int64_t(p) * s.page_size));
    const bf16* page = reinterpret_cast<const bf16*>(h.store->page_data(h.page_table[p]));
    if (plan.page_format[p] == ReadFormat::lossless13) {
      const std::span<bf16> out(unpacked.data() + slot++ * s.page_elements(), s.page_elements());
      kv::decode_lossless13_page(*view.compressed->lossless13_view(layer, p), out);
      page = out.data();
    }
    pages.push_back(cpu::PageRef::from_bf16(page, n));
  }
  return pages;
}

cpu::DecodeShape cpu_shape(const kv::KvShape& s, const attention::QueryRows& q,
                           const attention::AttentionOptions& opt) {
  return {s.n_kv_heads, q.n_heads / s.n_kv_heads, s.head_dim, s.page_size, opt.softmax_scale};
}

// A decode row over the segment by cpu/decode_attention.h.
attention::Partial attend_bf16_decode(const attention::LayerHistory& h, int layer, const RoutedView& view,
                                      const RoutePlan& plan, const Segment& seg, const attention::QueryRows& q,
                                      const attention::AttentionOptions& opt) {
  static thread_local cpu::CpuAttentionWorkspace ws;
  const kv::KvShape& s = h.store->shape();
  attention::Partial out(1, q.n_heads, s.head_dim);
  cpu::attend_pages(cpu_shape(s, q, opt), bf16_page_refs(h, layer, view, plan, seg), q.q, {}, ws, out.o.data(),
                    out.lse.data());
  return out;
}

// Prefill rows over the segment by cpu/prefill_attention.h.
attention::Partial attend_bf16_prefill(const attention::LayerHistory& h, int layer, const RoutedView& view,
                                       const RoutePlan& plan, const Segment& seg, const attention::QueryRows& q,
                                       const attention::AttentionOptions& opt) {
  static thread_local cpu::PrefillWorkspace ws;
  const kv::KvShape& s = h.store->shape();
  attention::Partial out(q.n_rows, q.n_heads, s.head_dim);
  const cpu::PrefillRows rows{q.q, q.positions, q.n_rows, opt.window};
  cpu::attend_prefill(cpu_shape(s, q, opt), bf16_page_refs(h, layer, view, plan, seg),
                      int64_t(seg.first_page) * s.page_size, rows, {}, ws, out.o.data(), out.lse.data());
  return out;
}

// Bytes the bf16 kernel reads for pages [first, first + n): stored bytes for
// exact pages, blob bytes for lossless13 pages.
double bf16_segment_bytes(const attention::LayerHistory& h, int layer, const RoutedView& view,
                          const RoutePlan& plan, const Segment& seg) {
  const kv::KvShape& s = h.store->shape();
  double bytes = 0;
  for (size_t p = seg.first_page; p < seg.first_page + seg.n_pages; ++p) {
    if (plan.page_format[p] == ReadFormat::lossless13) {
      bytes += double(view.compressed->published(layer, p, kv::CodecFormat::lossless13).size());
    } else {
      const int64_t first = int64_t(p) * s.page_size;
      bytes += double(std::min<int64_t>(s.page_size, h.n_tokens - first)) * double(s.bytes_per_token_per_layer());
    }
  }
  return bytes;
}

}  // namespace

attention::Partial attend_routed(const attention::LayerHistory& history, int layer, const RoutedView& view,
                                 const attention::QueryRows& q, const attention::AttentionOptions& opt,
                                 attention::Workspace& ws) {
  const kv::KvShape& shape = history.store->shape();
  PublishedFn published;
  if (view.compressed) {
    published = [&](size_t page, ReadFormat f) {
      return !view.compressed->published(layer, page, codec_of(f)).empty();
    };
  }
  // A sliding-window layer reads only the pages its rows can see.
  const RoutePlan plan = plan_route(view.config, history.n_tokens, shape.page_size, published,
                                    attention::first_visible_page(q, opt.window, shape.page_size));
  if (view.report) view.report->add(plan);

  attention::LayerHistory bf16_history = history;
  if (view.compressed && view.config.kind == RouteKind::lossless13) {
    bf16_history.read_planes = Lossless13Reader(view.compressed, layer, plan);
  }
  std::vector<attention::Partial> partials;
  partials.reserve(plan.segments.size());
  for (const Segment& seg : plan.segments) {
    if (seg.kernel == Kernel::int8s) {
      partials.push_back(attend_int8s_segment(history, layer, view, seg, q, opt));
      continue;
    }
    if (view.report) view.report->bytes += bf16_segment_bytes(history, layer, view, plan, seg);
    if (view.cpu_attention_kernels && in_place_decode(history, q, opt)) {
      partials.push_back(attend_bf16_decode(history, layer, view, plan, seg, q, opt));
      continue;
    }
    if (view.cpu_attention_kernels && in_place_prefill(history, q)) {
      partials.push_back(attend_bf16_prefill(history, layer, view, plan, seg, q, opt));
      continue;
    }
    partials.push_back(attention::attend_tile(bf16_history, seg.first_page, seg.n_pages, q, opt, ws));
  }
  if (partials.empty()) return attention::Partial(q.n_rows, q.n_heads, shape.head_dim);
  return attention::merge(partials);
}

}  // namespace activekv::route
