#include "activekv/route/routed_attention.h"

#include <map>
#include <vector>

#include "activekv/attention/attention_codecs.h"
#include "activekv/kv/codec_lossless13.h"

namespace activekv::route {
namespace {

kv::CodecFormat codec_of(ReadFormat f) {
  return f == ReadFormat::lossless13 ? kv::CodecFormat::lossless13 : kv::CodecFormat::int8s;
}

// Supplies lossless13 pages of a bf16 segment to the bf16 kernel, decoding
// each page once (all KV heads) on first use.
class Lossless13Reader {
 public:
  Lossless13Reader(const convert::CompressedHistory* c, int layer, const RoutePlan& plan, const kv::KvShape& s)
      : compressed_(c), layer_(layer), plan_(plan), shape_(s) {}

  bool operator()(size_t page, int kv_head, int n_keys, float* k, float* v) {
    if (plan_.page_format[page] != ReadFormat::lossless13) return false;
    const std::vector<bf16>& bf = decoded(page);
    const size_t n = size_t(n_keys) * size_t(shape_.head_dim);
    const bf16* kp = bf.data() + size_t(kv_head) * shape_.plane_elements();
    const bf16* vp = bf.data() + size_t(shape_.n_kv_heads + kv_head) * shape_.plane_elements();
    for (size_t i = 0; i < n; ++i) k[i] = bf16_to_f32(kp[i]);
    for (size_t i = 0; i < n; ++i) v[i] = bf16_to_f32(vp[i]);
    return true;
  }

 private:
  const std::vector<bf16>& decoded(size_t page) {
    auto it = pages_.find(page);
    if (it != pages_.end()) return it->second;
    std::vector<bf16> out(shape_.page_elements());
    kv::decode_lossless13_page(*compressed_->published(layer_, page, kv::CodecFormat::lossless13), out);
    return pages_.emplace(page, std::move(out)).first->second;
  }

  const convert::CompressedHistory* compressed_;
  int layer_;
  const RoutePlan& plan_;
  kv::KvShape shape_;
  std::map<size_t, std::vector<bf16>> pages_;
};

attention::Partial attend_int8s_segment(const attention::LayerHistory& history, int layer,
                                        const RoutedView& view, const Segment& seg,
                                        const attention::QueryRows& q, const attention::AttentionOptions& opt) {
  std::vector<const kv::EncodedPage*> pages;
  for (size_t p = seg.first_page; p < seg.first_page + seg.n_pages; ++p) {
    pages.push_back(view.compressed->published(layer, p, kv::CodecFormat::int8s));
    if (view.report) view.report->bytes += double(pages.back()->bytes.size());
  }
  const int64_t first_token = int64_t(seg.first_page) * history.store->shape().page_size;
  if (view.int8s_tile) return view.int8s_tile(pages, first_token, history.n_tokens, q, opt);
  return attention::attend_int8s_tile(pages, first_token, history.n_tokens, q, opt);
}

// Bytes the bf16 kernel reads for pages [first, first + n): stored bytes for
// exact pages, blob bytes for lossless13 pages.
double bf16_segment_bytes(const attention::LayerHistory& h, int layer, const RoutedView& view,
                          const RoutePlan& plan, const Segment& seg) {
  const kv::KvShape& s = h.store->shape();
  double bytes = 0;
  for (size_t p = seg.first_page; p < seg.first_page + seg.n_pages; ++p) {
    if (plan.page_format[p] == ReadFormat::lossless13) {
      bytes += double(view.compressed->published(layer, p, kv::CodecFormat::lossless13)->bytes.size());
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
      return view.compressed->published(layer, page, codec_of(f)) != nullptr;
    };
  }
  const RoutePlan plan = plan_route(view.config, history.n_tokens, shape.page_size, published);
  if (view.report) view.report->add(plan);

  attention::LayerHistory bf16_history = history;
  if (view.compressed && view.config.kind == RouteKind::lossless13) {
    bf16_history.read_planes = Lossless13Reader(view.compressed, layer, plan, shape);
  }
  std::vector<attention::Partial> partials;
  partials.reserve(plan.segments.size());
  for (const Segment& seg : plan.segments) {
    if (seg.kernel == Kernel::int8s) {
      partials.push_back(attend_int8s_segment(history, layer, view, seg, q, opt));
      continue;
    }
    if (view.report) view.report->bytes += bf16_segment_bytes(history, layer, view, plan, seg);
    partials.push_back(attention::attend_tile(bf16_history, seg.first_page, seg.n_pages, q, opt, ws));
  }
  if (partials.empty()) return attention::Partial(q.n_rows, q.n_heads, shape.head_dim);
  return attention::merge(partials);
}

}  // namespace activekv::route
