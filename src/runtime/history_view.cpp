// See history_view.h.
#include "history_view.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "activekv/cuda/kv_write.h"
#include "device_buffer.h"
#include "activekv/kv/codec.h"
#include "activekv/kv/codec_lossless13.h"

namespace activekv::runtime {
namespace {

kv::CodecFormat codec_of(route::ReadFormat f) {
  return f == route::ReadFormat::lossless13 ? kv::CodecFormat::lossless13 : kv::CodecFormat::int8s;
}

cuda::PageKind kind_of(route::ReadFormat f) {
  switch (f) {
    case route::ReadFormat::exact: return cuda::PageKind::bf16;
    case route::ReadFormat::lossless13: return cuda::PageKind::lossless13;
    case route::ReadFormat::int8s: return cuda::PageKind::int8s;
  }
  return cuda::PageKind::bf16;
}

// Largest encoded page of `f` for the shape (lossless13: every plane raw).
size_t max_encoded_bytes(kv::CodecFormat f, const kv::KvShape& s) {
  return f == kv::CodecFormat::lossless13 ? kv::lossless13_raw_page_bytes(s) : kv::encoded_page_bytes(f, s);
}

}  // namespace

HistoryView::HistoryView(kv::SequenceKv& seq, const std::vector<int>& windows, int max_rows,
                         const cuda::AttnShape& attn, const RuntimeOptions& opt, RuntimeStats& stats,
                         size_t budget_cap, const HistoryView* conversions_of)
    : seq_(seq), windows_(windows), store_of_(windows.size(), -1), attn_(attn), opt_(opt), stats_(stats) {
  const kv::KvShape& shape = seq.shape();
  const int L = shape.n_layers;
  pages_per_layer_ = (opt.n_ctx + shape.page_size - 1) / shape.page_size;
  int g = 0;
  for (size_t l = 0; l < windows.size(); ++l)
    if (windows[l] == 0) store_of_[l] = g++;
  if (g != L)
    throw InvalidArgument(fmt::format("HistoryView: the store has {} layers, the model {} global ones", L, g));
  // The rings first: the budget below is what the GPU has left after them.
  ring_ = std::make_unique<SlidingRing>(attn, windows, max_rows, pages_per_layer_);
  stats.sliding_layers = ring_->n_layers();
  stats.window = ring_->window();
  stats.ring_bytes = ring_->device_bytes();
  const size_t n_pages = size_t(pages_per_layer_) * size_t(L);
  if (opt.route.kind != route::RouteKind::exact) codecs_.push_back(codec_of(route::compressed_format(opt.route.kind)));
  const size_t enc_slot = codecs_.empty() ? 0 : max_encoded_bytes(codecs_[0], shape);
  const size_t history = n_pages * shape.page_bytes() + n_pages * enc_slot;
  const cuda::GpuMemory mem = cuda::gpu_memory();
  const size_t budget = opt.gpu_kv_mem > 0 ? opt.gpu_kv_mem
                                            : std::min(budget_cap, route::default_gpu_kv_budget(mem.free, mem.total));
  budget_ = budget;
  stats.placement = route::choose_placement(opt.placement, history, budget, size_t(L) * shape.page_bytes());
  placement_ = stats.placement.placement;
  if (partial_placement()) {  // the pools are taken at the first decode step (prefill runs as host)
    residency_ = route::plan_residency(opt.route, opt.n_ctx, shape.page_size, L, shape.page_bytes(), enc_slot, budget);
    stats.residency = residency_;
    stats.placement.reason += "; " + residency_.describe();
  }
  if (!gpu_placement()) {
    pages_ = std::make_unique<cuda::DevicePagePool>(shape.page_bytes(), size_t(L), "the tail pages");
  } else {
    pages_ = std::make_unique<cuda::DevicePagePool>(shape.page_bytes(), n_pages, "the resident history");
    if (enc_slot > 0)
      encoded_ = std::make_unique<cuda::DevicePagePool>(enc_slot, n_pages, "the resident encoded pages");
  }
  dev_.assign(size_t(L), std::vector<DevPage>(size_t(pages_per_layer_)));
  tables_host_.assign(n_pages, nullptr);
  tables_dev_ = static_cast<const void**>(cuda::device_malloc(n_pages * sizeof(void*), "the prefill page tables"));
  cuda::check_cuda(cudaMemset(tables_dev_, 0, n_pages * sizeof(void*)), "clear the prefill page tables");
  dev_encoded_.assign(size_t(L), std::vector<DevPage>(size_t(pages_per_layer_)));
  if (opt.cpu_share < 0 && !gpu_placement()) {  // co-attention, auto: the planner's rates, measured once
    const int threads = opt.cpu_threads > 0 ? opt.cpu_threads : std::max(1, int(std::thread::hardware_concurrency()) - 1);
    calibration_ = cuda::co_attention_rates_once(attn, threads, 0.1);  // the machine's: once per process
    cpu_feedback_.emplace(calibration_->together);
    stats.co_attention = calibration_->describe();
  }
  if (conversions_of) {
    if (&conversions_of->seq_ != &seq_ || conversions_of->codecs_ != codecs_)
      throw InvalidArgument("HistoryView: another view's conversions are of another history or route");
    compressed_ = conversions_of->compressed_;
  } else if (!codecs_.empty()) {
    if (opt.convert_threads > 0) pool_ = std::make_unique<convert::ConversionPool>(opt.convert_threads);
    own_compressed_ = std::make_unique<convert::CompressedHistory>(seq, codecs_, size_t(pages_per_layer_), pool_.get());
    compressed_ = own_compressed_.get();
  }
}

HistoryView::~HistoryView() {
  own_compressed_.reset();  // cancels queued conversions, waits for running ones
  pool_.reset();
  cudaFree(tables_dev_);
}

const std::byte* HistoryView::host_page(int layer, size_t page) const {
  return seq_.store().page_data(seq_.page_table(layer)[page]);
}

// Records where page (layer, page) lies on the GPU, and queues the change of
// the device page table.
void HistoryView::set_copy(int layer, size_t page, DevPage d) {
  dev_[size_t(layer)][page] = d;
  set_table(layer, page, d.ptr);
}

void HistoryView::set_table(int layer, size_t page, const void* ptr) {
  const size_t i = size_t(layer) * size_t(pages_per_layer_) + page;
  if (tables_host_[i] == ptr) return;
  tables_host_[i] = ptr;
  dirty_.push_back(i);
}

// The changed entries go to the device, each once with its final value (the
// scatter writes its patches in parallel: two patches of one entry would race).
void HistoryView::submit_tables(cudaStream_t s) {
  std::sort(dirty_.begin(), dirty_.end());
  dirty_.erase(std::unique(dirty_.begin(), dirty_.end()), dirty_.end());
  std::vector<cuda::Patch> patches;
  patches.reserve(dirty_.size());
  for (size_t i : dirty_) patches.push_back(cuda::make_patch(&tables_dev_[i], &tables_host_[i], sizeof(void*)));
  patches_.submit(patches, s);  // before the step's kernels read them
  dirty_.clear();
}

void HistoryView::give_copy(int layer, size_t page, cuda::DevicePagePool& pool, bool upload, cudaStream_t s) {
  DevPage d{pool.acquire(), &pool};
  if (upload)
    cuda::check_cuda(cudaMemcpyAsync(d.ptr, host_page(layer, page), seq_.shape().page_bytes(), cudaMemcpyHostToDevice, s),
                     "upload a page");
  set_copy(layer, page, d);
}

void HistoryView::drop_copy(int layer, size_t page) {
  DevPage& d = dev_[size_t(layer)][page];
  if (!d.ptr) return;
  d.pool->release(d.ptr);
  set_copy(layer, page, DevPage{});
}

route::PrefillPlan HistoryView::plan_prefill(int64_t n_new, int chunk, int stream_chunk, bool allow_resident) const {
  if (gpu_placement()) {  // every page has a device copy already
    route::PrefillPlan p;
    p.chunk = chunk;
    return p;
  }
  const kv::KvShape& shape = seq_.shape();
  route::PrefillPlanInput in;
  in.budget_bytes = budget_;
  in.page_bytes = shape.page_bytes();
  in.page_size = shape.page_size;
  in.n_layers = shape.n_layers;
  in.tail_bytes = pages_->n_slots() * pages_->slot_bytes();
  in.pos0 = seq_.n_tokens();
  in.n_tokens = n_new;
  in.chunk = chunk;
  in.stream_chunk = stream_chunk;
  in.allow_resident = allow_resident;
  return route::plan_prefill(in);
}

void HistoryView::begin_prefill(const route::PrefillPlan& plan, cudaStream_t s) {
  if (gpu_placement()) return;
  if (prompt_) prefill_done(s);  // an earlier prefill stopped by an error: keep its tails, free the rest
  if (partial_placement()) {  // the budget goes to the prompt while it runs: the next decode step re-takes the pools
    cuda::check_cuda(cudaStreamSynchronize(s), "before giving back the resident pages");
    release_residency();
  }
  const kv::KvShape& shape = seq_.shape();
  if (!plan.streamed) {
    prompt_ = std::make_unique<cuda::DevicePagePool>(shape.page_bytes(), plan.device_bytes / shape.page_bytes(),
                                                     "the prompt's history");
    return;
  }
  prompt_ = std::make_unique<cuda::DevicePagePool>(
      shape.page_bytes(), size_t(plan.chunk_pages) * size_t(shape.n_layers), "the prefill chunk's pages");
  try {
    if (plan.staging_pages > 0)
      stream_ = std::make_unique<PrefillStream>(attn_, shape.n_layers, plan.staging_pages, plan.chunk);
  } catch (...) {
    prompt_.reset();
    throw;
  }
  streamed_ = true;
}

void HistoryView::prepare(int64_t pos0, int T, bool prefill, cudaStream_t s) {
  const int ps = seq_.shape().page_size;
  const size_t last = size_t((pos0 + T - 1) / ps);
  if (partial_placement() && !prefill) take_residency();
  for (int l = 0; l < seq_.shape().n_layers; ++l) {
    std::vector<DevPage>& d = dev_[size_t(l)];
    if (gpu_placement()) {
      for (size_t p = 0; p <= last; ++p)
        if (!d[p].ptr) give_copy(l, p, *pages_, int64_t(p) * ps < pos0, s);
      continue;
    }
    if (prefill) {
      if (!prompt_) throw InvalidArgument("HistoryView: prefill without begin_prefill");
      if (streamed_) {
        prepare_streamed(l, pos0, last, s);
        continue;
      }
      for (size_t p = 0; p <= last; ++p)
        if (!d[p].ptr) give_copy(l, p, *prompt_, int64_t(p) * ps < pos0, s);
      continue;
    }
    if (partial_placement()) {  // the tail and the hot pages the budget holds
      place_layer(l, pos0, pos0 + T, s);
      continue;
    }
    // host decode: only the tail page lives on the GPU.
    for (size_t p = 0; p < last; ++p) drop_copy(l, p);
    if (!d[last].ptr) give_copy(l, last, *pages_, int64_t(last) * ps < pos0, s);
  }
  submit_tables(s);
  // Streamed prefill: the layers' full pages before the chunk's first page
  // come from the host store through the staging.
  if (prefill && stream_)
    stream_->begin_chunk(pos0 / ps, [this](int l, size_t p) { return host_page(l, p); }, s);
}

// A streamed chunk keeps device copies of only the pages it writes (the first
// may hold earlier tokens: it stays from the chunk before, or is uploaded);
// the full pages before it are dropped -- they are in the host store -- and,
// when a staging buffer holds the layer's whole history, the page table
// points at their staged copies instead.
void HistoryView::prepare_streamed(int l, int64_t pos0, size_t last, cudaStream_t s) {
  const int ps = seq_.shape().page_size;
  const size_t first = size_t(pos0 / ps);
  std::vector<DevPage>& d = dev_[size_t(l)];
  for (size_t p = 0; p < first; ++p) drop_copy(l, p);
  for (size_t p = first; p <= last; ++p)
    if (!d[p].ptr) give_copy(l, p, *prompt_, int64_t(p) * ps < pos0, s);
  if (stream_ && stream_->whole_layer(int64_t(first)))
    for (size_t p = 0; p < first; ++p) set_table(l, p, stream_->slot(PrefillStream::layer_buffer(l), int64_t(p)));
}

int HistoryView::store_layer(int layer) const {
  const int g = store_of_.at(size_t(layer));
  if (g < 0) throw InvalidArgument(fmt::format("HistoryView: layer {} slides: it has no host pages", layer));
  return g;
}

cuda::KvSlot HistoryView::kv_slot(int layer, int64_t pos) const {
  const int ps = seq_.shape().page_size;
  const size_t p = size_t(pos / ps);
  const int slot = int(pos % ps);
  if (ring_->sliding(layer)) return {ring_->page(layer, int64_t(p)), nullptr, slot};  // a sliding layer has no host pages
  // The host page through its mapped pinned address (the store's memory is
  // cudaHostAllocMapped; with unified addressing the pointers coincide).
  const int g = store_layer(layer);
  return {dev_[size_t(g)][p].ptr, const_cast<std::byte*>(host_page(g, p)), slot};
}

void HistoryView::write_kv(int layer, int64_t pos0, int T, const float* k, const float* v, cudaStream_t s) {
  const int ps = seq_.shape().page_size;
  // k, v rows hold the attention shape's heads: all of them, or a head shard's (tensor parallel).
  const int64_t row = int64_t(attn_.n_kv_heads) * attn_.head_dim;
  if (ring_->sliding(layer) && T > ring_->max_rows())
    throw InvalidArgument(fmt::format("HistoryView: {} rows at once, the sliding layers' rings hold chunks of {}", T,
                                      ring_->max_rows()));
  for (int64_t t = pos0; t < pos0 + T;) {
    const cuda::KvSlot to = kv_slot(layer, t);
    const int n = int(std::min<int64_t>(ps - to.slot, pos0 + T - t));
    cuda::launch_write_kv(attn_, k + (t - pos0) * row, v + (t - pos0) * row, row, n, to.slot, to.device_page,
                          to.host_page, s);
    t += n;
  }
}

void RouteCounts::add_to(RuntimeStats& stats) const {
  for (int f = 0; f < 3; ++f) stats.pages.pages[f] += report.pages[f];
  for (int k = 0; k < 2; ++k) stats.pages.segments[k] += report.segments[k];
  stats.pages.bytes += report.bytes;
  stats.resident_pages += resident;
  stats.streamed_pages += streamed;
  stats.cpu_pages += cpu;
}

std::vector<cuda::SeqPages> HistoryView::engine_tables(int64_t n_tokens, cudaStream_t s, RouteCounts& counts) {
  const kv::KvShape& shape = seq_.shape();
  const size_t n_pages = size_t((n_tokens + shape.page_size - 1) / shape.page_size);
  std::vector<cuda::SeqPages> out(1);
  out[0].n_tokens = n_tokens;
  out[0].tables.resize(windows_.size());
  for (size_t ml = 0; ml < windows_.size(); ++ml) {
    std::vector<cuda::PageRef>& table = out[0].tables[ml];
    table.resize(n_pages);
    if (ring_->sliding(int(ml))) {  // every entry its ring page; the engine reads only those in the window
      for (size_t p = 0; p < n_pages; ++p)
        table[p] = cuda::PageRef{nullptr, ring_->page(int(ml), int64_t(p)), shape.page_bytes(), cuda::PageKind::bf16};
      continue;
    }
    const int l = store_of_[ml];
    const route::RoutePlan plan = route_plan(l, n_tokens);
    counts.report.add(plan);
    for (size_t p = 0; p < n_pages; ++p) {
      const route::ReadFormat f = plan.page_format[p];
      if (f == route::ReadFormat::exact) {
        table[p] = cuda::PageRef{host_page(l, p), dev_[size_t(l)][p].ptr, shape.page_bytes(), cuda::PageKind::bf16};
        counts.report.bytes += double(std::min<int64_t>(shape.page_size, n_tokens - int64_t(p) * shape.page_size)) *
                               double(shape.bytes_per_token_per_layer());
        continue;
      }
      const std::span<const std::byte> e = compressed_->published(l, p, codec_of(f));
      DevPage& d = dev_encoded_[size_t(l)][p];
      if (gpu_placement() && !d.ptr) {  // the encoded page is read on the GPU too (partial: place_layer chose)
        d.ptr = encoded_->acquire();
        d.pool = encoded_.get();
        cuda::check_cuda(cudaMemcpyAsync(d.ptr, e.data(), e.size(), cudaMemcpyHostToDevice, s),
                         "upload an encoded page");
      }
      table[p] = cuda::PageRef{e.data(), d.ptr, e.size(), kind_of(f)};
      counts.report.bytes += double(e.size());
    }
    if (opt_.cpu_share != 0 && !gpu_placement()) share_with_cpu(l, table);
    for (const cuda::PageRef& r : table) ++(r.cpu ? counts.cpu : r.device ? counts.resident : counts.streamed);
  }
  return out;
}

route::RoutePlan HistoryView::route_plan(int l, int64_t n_tokens) const {
  route::PublishedFn published;
  if (compressed_)
    published = [&](size_t page, route::ReadFormat f) { return !compressed_->published(l, page, codec_of(f)).empty(); };
  return route::plan_route(opt_.route, n_tokens, seq_.shape().page_size, published);
}

// Partial placement: the pools plan_residency sized, taken at the first
// decode step after a prefill (which had the budget for the prompt).
void HistoryView::take_residency() {
  const size_t L = size_t(seq_.shape().n_layers);
  if (!resident_ && residency_.bf16_slots > 0)
    resident_ = std::make_unique<cuda::DevicePagePool>(seq_.shape().page_bytes(), L * residency_.bf16_slots,
                                                       "the resident pages (partial placement)");
  if (!encoded_ && residency_.encoded_slots > 0)
    encoded_ = std::make_unique<cuda::DevicePagePool>(max_encoded_bytes(codecs_.at(0), seq_.shape()),
                                                      L * residency_.encoded_slots,
                                                      "the resident encoded pages (partial placement)");
}

// Gives back every resident copy but the tails (pages_), and the pools.
void HistoryView::release_residency() {
  for (int l = 0; l < seq_.shape().n_layers; ++l)
    for (size_t p = 0; p < dev_[size_t(l)].size(); ++p) {
      if (resident_ && dev_[size_t(l)][p].pool == resident_.get()) drop_copy(l, p);
      drop_encoded(l, p);
    }
  resident_.reset();
  encoded_.reset();
}

void HistoryView::drop_encoded(int layer, size_t page) {
  DevPage& d = dev_encoded_[size_t(layer)][page];
  if (!d.ptr) return;
  d.pool->release(d.ptr);
  d = DevPage{};
}

// Partial placement, one store layer, before a decode step over n_tokens
// tokens (rows from pos0 on): route/residency.h chooses the pages to keep,
// in the format the route reads them now, within the layer's share of the
// budget and the pools' slots. Copies it no longer wants go first, so the
// slots they free serve the pages it wants; the last tail (a full page now)
// moves from the tail pool to the resident one on the GPU (no upload).
void HistoryView::place_layer(int l, int64_t pos0, int64_t n_tokens, cudaStream_t s) {
  const kv::KvShape& shape = seq_.shape();
  const route::RoutePlan plan = route_plan(l, n_tokens);
  const size_t n = plan.page_format.size(), last = n - 1;
  std::vector<route::ResidencyPage> pages(n);
  for (size_t p = 0; p < n; ++p) {
    const route::ReadFormat f = plan.page_format[p];
    pages[p] = f == route::ReadFormat::exact
                   ? route::ResidencyPage{shape.page_bytes(), false}
                   : route::ResidencyPage{compressed_->published(l, p, codec_of(f)).size(), true};
  }
  const route::ResidencyLimits limits{budget_ / uint64_t(shape.n_layers), residency_.bf16_slots,
                                      residency_.encoded_slots};
  const std::vector<bool> want = route::choose_resident_pages(pages, opt_.route.sink_pages, opt_.route.recent_pages, limits);
  std::vector<DevPage>& d = dev_[size_t(l)];
  for (size_t p = 0; p < last; ++p) {
    if (d[p].ptr && !(want[p] && !pages[p].encoded)) drop_copy(l, p);
    if (!(want[p] && pages[p].encoded)) drop_encoded(l, p);
  }
  for (size_t p = 0; p < last; ++p)  // the former tail, first: its tail slot goes to the new tail
    if (d[p].pool == pages_.get()) keep_resident(l, p, false, plan.page_format[p], s);
  if (!d[last].ptr) give_copy(l, last, *pages_, int64_t(last) * shape.page_size < pos0, s);
  for (size_t p = 0; p < last; ++p)
    if (want[p]) keep_resident(l, p, pages[p].encoded, plan.page_format[p], s);
}

// Page `page` of store layer l keeps a device copy in the resident pools:
// bf16 (moved on the GPU from the tail pool, else uploaded) or encoded
// (uploaded once: a published page never changes). A full pool leaves it
// streamed.
void HistoryView::keep_resident(int l, size_t page, bool encoded, route::ReadFormat f, cudaStream_t s) {
  if (encoded) {
    DevPage& e = dev_encoded_[size_t(l)][page];
    if (e.ptr || !encoded_ || encoded_->free_slots() == 0) return;
    const std::span<const std::byte> blob = compressed_->published(l, page, codec_of(f));
    e = DevPage{encoded_->acquire(), encoded_.get()};
    cuda::check_cuda(cudaMemcpyAsync(e.ptr, blob.data(), blob.size(), cudaMemcpyHostToDevice, s),
                     "upload an encoded page (partial placement)");
    stats_.residency_upload_bytes += blob.size();
    return;
  }
  DevPage& d = dev_[size_t(l)][page];
  if (resident_ && d.ptr && d.pool == resident_.get()) return;
  if (!resident_ || resident_->free_slots() == 0) {
    drop_copy(l, page);  // no room: it streams (a tail copy leaves the tail pool either way)
    return;
  }
  std::byte* slot = resident_->acquire();
  const size_t bytes = seq_.shape().page_bytes();
  if (d.ptr) {
    cuda::check_cuda(cudaMemcpyAsync(slot, d.ptr, bytes, cudaMemcpyDeviceToDevice, s), "keep a full tail page resident");
    drop_copy(l, page);
  } else {
    cuda::check_cuda(cudaMemcpyAsync(slot, host_page(l, page), bytes, cudaMemcpyHostToDevice, s),
                     "upload a page (partial placement)");
    stats_.residency_upload_bytes += bytes;
  }
  set_copy(l, page, DevPage{slot, resident_.get()});
}

// The oldest pages the CPU can read go to the host CPU (co-attention): as
// many as cpu_share of the layer's pages, or, with auto, as the planner
// chooses from layer 0's table each step (the layers' tables are alike). Not
// the tail (it has a device copy: the GPU writes it), not lossless13 pages
// (the CPU kernels do not unpack); int8s pages with their view.
void HistoryView::share_with_cpu(int layer, std::vector<cuda::PageRef>& table) {
  size_t n = 0;
  if (opt_.cpu_share > 0) {
    n = std::min(table.size() - 1, size_t(std::lround(opt_.cpu_share * double(table.size()))));
  } else {
    if (layer == 0) {
      last_plan_ = route::plan_co_attention(cuda::plan_pages(table), seq_.shape().n_layers, cpu_feedback_->rates(),
                                            calibration_->link_alone_gbps);
      const std::string learnt = cpu_feedback_->describe();
      stats_.co_attention =
          calibration_->describe() + (learnt.empty() ? "" : "; " + learnt) + "; last step: " + last_plan_.describe();
    }
    n = last_plan_.cpu_pages;
  }
  for (size_t p = 0, given = 0; p < table.size() && given < n; ++p) {
    cuda::PageRef& r = table[p];
    if (r.device || r.kind == cuda::PageKind::lossless13) continue;
    if (r.kind == cuda::PageKind::int8s) {
      r.int8s_view = compressed_->int8s_view(layer, p);
      if (!r.int8s_view) continue;
    }
    r.cpu = true;
    ++given;
  }
}

void HistoryView::observe_cpu(const cuda::DecodeEngine::CpuTiming& t) {
  if (cpu_feedback_) cpu_feedback_->observe(t.busy_ms, double(t.bytes), t.layers, last_plan_);
}

const void* const* HistoryView::device_pages(int layer, int64_t n_tokens) const {
  const size_t n = size_t((n_tokens + seq_.shape().page_size - 1) / seq_.shape().page_size);
  const size_t first = size_t(layer) * size_t(pages_per_layer_);
  for (size_t p = 0; p < n; ++p)
    if (!tables_host_[first + p])
      throw InvalidArgument(fmt::format("HistoryView: layer {} page {} has no device copy", layer, p));
  return tables_dev_ + first;
}

void HistoryView::prefill_attention(int model_layer, int64_t pos0, int rows, const float* q, float* out,
                                    cuda::PrefillAttention& pa, cudaStream_t s) {
  const int ps = seq_.shape().page_size;
  const int64_t n_pages = (pos0 + rows + ps - 1) / ps;
  if (ring_->sliding(model_layer)) {
    pa.run(ring_->table(model_layer), n_pages, pos0, rows, q, out, nullptr, s, ring_->window());
    return;
  }
  const int layer = store_layer(model_layer);
  if (stream_) {
    stream_->attend(layer, tables_dev_ + size_t(layer) * size_t(pages_per_layer_), n_pages, pos0, rows, q, out, pa,
                    s);
    return;
  }
  pa.run(device_pages(layer, pos0 + rows), n_pages, pos0, rows, q, out, nullptr, s);
}

uint64_t HistoryView::route_version() const {
  if (!compressed_) return 0;
  return compressed_->published_count(kv::CodecFormat::lossless13) + compressed_->published_count(kv::CodecFormat::int8s);
}

void HistoryView::committed() {
  if (own_compressed_) own_compressed_->schedule();
}

void HistoryView::wait_conversions() {
  if (compressed_) compressed_->wait();
}

size_t HistoryView::prefill_done(cudaStream_t s) {
  if (!prompt_) return 0;
  const int ps = seq_.shape().page_size;
  const int64_t n = seq_.n_tokens();
  for (int l = 0; l < seq_.shape().n_layers; ++l) {
    for (size_t p = 0; p < dev_[size_t(l)].size(); ++p) {
      DevPage& d = dev_[size_t(l)][p];
      if (!d.ptr) continue;
      const bool tail = n % ps != 0 && int64_t(p) == n / ps;  // the partly written page decode continues
      if (d.pool == pages_.get()) {  // an earlier decode's tail page: full now, unless still the tail
        if (!tail) drop_copy(l, p);  // (before the new tail takes a slot: one slot per layer)
        continue;
      }
      if (d.pool != prompt_.get()) continue;
      if (tail) {
        std::byte* keep = pages_->acquire();
        cuda::check_cuda(cudaMemcpyAsync(keep, d.ptr, seq_.shape().page_bytes(), cudaMemcpyDeviceToDevice, s),
                         "keep the tail page");
        drop_copy(l, p);
        set_copy(l, p, DevPage{keep, pages_.get()});
      } else {
        drop_copy(l, p);
      }
    }
  }
  // Entries that pointed at staged copies: back to the device copies (none, for full pages).
  for (int l = 0; l < seq_.shape().n_layers; ++l)
    for (size_t p = 0; p < dev_[size_t(l)].size(); ++p) set_table(l, p, dev_[size_t(l)][p].ptr);
  submit_tables(s);
  cuda::check_cuda(cudaStreamSynchronize(s), "prefill_done");  // nothing reads the prompt pool or the staging any more
  size_t moved = 0;
  if (stream_) {
    stream_->synchronize();
    moved = stream_->bytes_moved();
    stream_.reset();
  }
  prompt_.reset();
  streamed_ = false;
  return moved;
}

}  // namespace activekv::runtime
