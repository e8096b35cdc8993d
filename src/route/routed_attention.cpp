#include "activekv/route/routed_attention.h"

#include <memory>
#include <vector>

#include "activekv/attention/attention_codecs.h"

namespace activekv::route {
namespace {

kv::CodecFormat codec_of(ReadFormat f) {
  return f == ReadFormat::lossless13 ? kv::CodecFormat::lossless13 : kv::CodecFormat::int8s;
}

// One compressed segment: gather its published pages (kept alive while read)
// and run the kernel of its format.
attention::Partial attend_compressed(const attention::LayerHistory& history, int layer, const RoutedView& view,
                                     const Segment& seg, const attention::QueryRows& q,
                                     const attention::AttentionOptions& opt) {
  std::vector<std::shared_ptr<const kv::EncodedPage>> keep;
  std::vector<const kv::EncodedPage*> pages;
  for (size_t p = seg.first_page; p < seg.first_page + seg.n_pages; ++p) {
    keep.push_back(view.compressed->published(layer, p, codec_of(seg.format)));
    pages.push_back(keep.back().get());
  }
  if (view.report) {
    for (const auto& page : keep) view.report->bytes += double(page->bytes.size());
  }
  const int64_t first_token = int64_t(seg.first_page) * history.store->shape().page_size;
  return seg.format == ReadFormat::int8s
             ? attention::attend_int8s_tile(pages, first_token, history.n_tokens, q, opt)
             : attention::attend_lossless13_tile(pages, first_token, history.n_tokens, q, opt);
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
  const std::vector<Segment> segments = plan_route(view.config, history.n_tokens, shape.page_size, published);
  if (view.report) view.report->add(segments);

  std::vector<attention::Partial> partials;
  partials.reserve(segments.size());
  for (const Segment& seg : segments) {
    if (seg.format == ReadFormat::exact) {
      if (view.report) {
        const int64_t first = int64_t(seg.first_page) * shape.page_size;
        const int64_t end = std::min<int64_t>(history.n_tokens, first + int64_t(seg.n_pages) * shape.page_size);
        view.report->bytes += double(end - first) * double(shape.bytes_per_token_per_layer());
      }
      partials.push_back(attention::attend_tile(history, seg.first_page, seg.n_pages, q, opt, ws));
    } else {
      partials.push_back(attend_compressed(history, layer, view, seg, q, opt));
    }
  }
  if (partials.empty()) {
    return attention::Partial(q.n_rows, q.n_heads, shape.head_dim);
  }
  return attention::merge(partials);
}

}  // namespace activekv::route
