// See cpu_history.h.
#include "cpu_history.h"

#include "memory.h"

namespace activekv::cli {

HistoryPlan plan_history(const std::string& kv_format) {
  if (kv_format == "bf16" || kv_format == "f32") return {kv::parse_page_format(kv_format), route::RouteKind::exact, {}};
  const route::RouteKind kind = route::parse_kind(kv_format);
  const kv::CodecFormat codec =
      kind == route::RouteKind::lossless13 ? kv::CodecFormat::lossless13 : kv::CodecFormat::int8s;
  return {kv::PageFormat::bf16, kind, {codec}};
}

CpuHistory::CpuHistory(const model::LlamaModel& lm, const CpuHistoryOptions& o, int64_t n_ctx) {
  const HistoryPlan plan = plan_history(o.kv_format);
  const kv::KvShape shape = lm.kv_shape(o.page_size, plan.page_format);
  const size_t pages_per_layer = size_t((n_ctx + o.page_size - 1) / o.page_size);
  require_page_store(shape, n_ctx);  // refuse now what could not be held, not hours in
  store_ = std::make_unique<kv::PageStore>(shape, pages_per_layer * size_t(lm.config().n_layers));
  seq_ = std::make_unique<kv::SequenceKv>(*store_);
  if (!plan.codecs.empty()) {
    pool_ = std::make_unique<convert::ConversionPool>(o.convert_threads);
    compressed_ = std::make_unique<convert::CompressedHistory>(*seq_, plan.codecs, pages_per_layer, pool_.get());
  }
  view_.compressed = compressed_.get();
  view_.config = {plan.route, o.recent_pages, o.tile_pages};
}

void CpuHistory::schedule() {
  if (compressed_) compressed_->schedule();
}

void CpuHistory::wait() {
  if (compressed_) compressed_->wait();
}

}  // namespace activekv::cli
