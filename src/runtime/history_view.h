// Internal to the GPU runtime: the KV history of one sequence as the GPU
// sees it -- which pages have device copies (placement), which published
// encoded pages the route reads, the page tables handed to the decode engine
// and to prefill attention, the writes of new tokens' K/V, and where a
// prefill keeps the prompt's history (resident, or streamed per chunk through
// a staging area when it does not fit the GPU budget: prefill_stream.h).
//
// Placements: gpu (every page has a device copy), host (only each layer's
// tail page), partial (the tail plus the hot pages route/residency.h chooses
// each decode step within the budget: a bf16 copy for a page read exact, an
// encoded copy for a page read compressed; the rest streams). With partial,
// prefill runs as with host (the resident copies are given back first) and
// the resident pools are taken again by the next decode step.
//
// Layers: the model's layers that attend the whole history ("global") keep
// it in the page store -- store layer g is the g-th global model layer; the
// sliding-window layers (Gemma 3's local ones) keep theirs only in a GPU ring
// (sliding_ring.h): no host pages, no streaming, no conversion. Methods that
// take a `layer` take a model layer.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "activekv/convert/compressed_history.h"
#include "activekv/cuda/co_attention_rates.h"
#include "activekv/cuda/decode_engine.h"
#include "activekv/cuda/device_pages.h"
#include "activekv/cuda/kv_write.h"
#include "activekv/cuda/patch.h"
#include "activekv/cuda/prefill.h"
#include "activekv/route/cpu_rate_feedback.h"
#include "activekv/kv/page_store.h"
#include "activekv/route/prefill_plan.h"
#include "activekv/route/residency.h"
#include "activekv/runtime/gpu_runtime.h"
#include "prefill_stream.h"
#include "sliding_ring.h"

namespace activekv::runtime {

/// What one decode step's page tables read, by format and by place: counted
/// into RuntimeStats when the step commits (a step enqueued ahead may be
/// discarded instead: gpu_sequence.cpp).
struct RouteCounts {
  route::RouteReport report;
  size_t resident = 0, streamed = 0, cpu = 0;
  void add_to(RuntimeStats& stats) const;
};

class HistoryView {
 public:
  /// `seq`: the history of the global layers (windows[l] == 0, in order);
  /// windows: [model layers] each layer's window (0: global). Allocates the
  /// sliding layers' rings (chunks of up to max_rows rows), then chooses the
  /// placement (stats.placement) of the global layers' history from opt and
  /// the GPU memory free now, and takes the device pages it needs. The
  /// budget is opt.gpu_kv_mem, or (0) the free memory less the margin but at
  /// most `budget_cap` (what the model's budget has left for this sequence).
  /// `conversions_of` (tensor parallel: several views of one SequenceKv, one
  /// per head shard): read that view's published pages -- the same store and
  /// route -- instead of converting every page again; this view then
  /// schedules no conversion, and that view must outlive it.
  /// Throws Error when --kv-placement gpu does not fit, InvalidArgument when
  /// `conversions_of` is of another history or route.
  HistoryView(kv::SequenceKv& seq, const std::vector<int>& windows, int max_rows, const cuda::AttnShape& attn,
              const RuntimeOptions& opt, RuntimeStats& stats, size_t budget_cap = SIZE_MAX,
              const HistoryView* conversions_of = nullptr);
  ~HistoryView();
  HistoryView(const HistoryView&) = delete;
  HistoryView& operator=(const HistoryView&) = delete;

  /// Where a prefill of `n_new` tokens would keep the prompt's history
  /// (activekv/route/prefill_plan.h) under the GPU budget: resident with
  /// chunks of `chunk` tokens when it fits (always, with gpu placement),
  /// else streamed with chunks of `stream_chunk` (or fewer). allow_resident
  /// false: streamed even if it fits (after the resident pages could not be
  /// had). Throws Error with the sizes when not even streaming fits.
  route::PrefillPlan plan_prefill(int64_t n_new, int chunk, int stream_chunk, bool allow_resident = true) const;
  /// Takes the device pages `plan` needs (host placement): every prompt page
  /// (resident), or the chunk pages and the staging (streamed). Throws
  /// CudaError naming the pool when they cannot be had.
  /// Ends an earlier prefill that an error stopped first (prefill_done).
  void begin_prefill(const route::PrefillPlan& plan, cudaStream_t s);
  /// Before rows [pos0, pos0 + T) are written (pages reserved in the
  /// sequence): gives every page the step reads or writes a device copy
  /// where the placement wants one (uploading tokens already written).
  void prepare(int64_t pos0, int T, bool prefill, cudaStream_t s);
  /// Stores K/V of rows [pos0, pos0 + T) of `layer` (device fp32
  /// [T][n_kv_heads*head_dim]) as bf16 into the device copies and the host pages.
  void write_kv(int layer, int64_t pos0, int T, const float* k, const float* v, cudaStream_t s);
  /// Where row `pos` of `layer` goes (prepare()d): its page's device copy
  /// (a sliding layer's ring page) and host page, and its slot -- what
  /// write_kv writes, for a decode batch's one launch (launch_write_kv_slots).
  cuda::KvSlot kv_slot(int layer, int64_t pos) const;
  /// The attention shape of this history's pages (page size, heads, head_dim).
  const cuda::AttnShape& attn_shape() const { return attn_; }
  /// With `--cpu-share auto`: whether the planner learns the CPU's rate from
  /// the steps, and a measured interval of the engine's CPU layer tasks to
  /// learn it from (route/cpu_rate_feedback.h); the next step's plan uses it.
  bool learns_cpu_rate() const { return cpu_feedback_.has_value(); }
  void observe_cpu(const cuda::DecodeEngine::CpuTiming& t);
  /// The engine's page tables for a step over `n_tokens` tokens, one per model
  /// layer: a global layer's along the route (uploading, with gpu placement,
  /// published encoded pages not yet on the GPU; what it reads is added to
  /// `counts`, which the caller adds to the stats when the step commits), a
  /// sliding layer's its ring pages (device only).
  std::vector<cuda::SeqPages> engine_tables(int64_t n_tokens, cudaStream_t s, RouteCounts& counts);
  /// Device array of the device addresses of `layer`'s pages covering
  /// `n_tokens` (prefill attention's page table; kept up to date by prepare()).
  const void* const* device_pages(int layer, int64_t n_tokens) const;
  /// Prefill attention of `layer`'s rows [pos0, pos0 + rows) (their K/V
  /// written) over the history: in place when resident, through the
  /// staging when streamed, over its ring with its window when it slides.
  /// Enqueued on `s`.
  void prefill_attention(int layer, int64_t pos0, int rows, const float* q, float* out, cuda::PrefillAttention& pa,
                         cudaStream_t s);
  /// After a commit: queues conversion of pages that became full (not on a
  /// view that reads another's conversions).
  void committed();
  /// Waits until every queued conversion has published its page.
  void wait_conversions();
  /// The route's published pages (nullptr for the exact route) and the
  /// model layers' store layers (-1: sliding), for GpuRuntime::host_history.
  convert::CompressedHistory* compressed() const { return compressed_; }
  /// Changes whenever a compressed page is published (0 for exact routes): a
  /// decode step's route is the one of the version its tables were built at,
  /// so a step built ahead is stale once this moved (gpu_sequence.cpp).
  uint64_t route_version() const;
  const std::vector<int>& store_layers() const { return store_of_; }
  /// GPU bytes the history's device pages may use.
  size_t budget() const { return budget_; }
  /// After the prompt: with host placement, frees the prompt's device pages
  /// but each layer's tail, and the staging; returns the host -> device
  /// bytes a streamed prefill moved (0 when resident).
  size_t prefill_done(cudaStream_t s);

 private:
  struct DevPage {
    std::byte* ptr = nullptr;
    cuda::DevicePagePool* pool = nullptr;
  };
  void give_copy(int layer, size_t page, cuda::DevicePagePool& pool, bool upload, cudaStream_t s);
  void drop_copy(int layer, size_t page);
  void set_copy(int layer, size_t page, DevPage d);
  void set_table(int layer, size_t page, const void* ptr);
  void submit_tables(cudaStream_t s);
  void prepare_streamed(int l, int64_t pos0, size_t last, cudaStream_t s);
  route::RoutePlan route_plan(int layer, int64_t n_tokens) const;  // layer: a store layer
  void take_residency();
  void place_layer(int l, int64_t pos0, int64_t n_tokens, cudaStream_t s);
  void keep_resident(int l, size_t page, bool encoded, route::ReadFormat f, cudaStream_t s);
  void drop_encoded(int layer, size_t page);
  void release_residency();
  void share_with_cpu(int layer, std::vector<cuda::PageRef>& table);
  int store_layer(int layer) const;  // the global model layer's store layer
  const std::byte* host_page(int layer, size_t page) const;
  bool host_placement() const { return placement_ == route::KvPlacement::host; }
  bool gpu_placement() const { return placement_ == route::KvPlacement::gpu; }
  bool partial_placement() const { return placement_ == route::KvPlacement::partial; }

  kv::SequenceKv& seq_;
  std::vector<int> windows_;   // [model layer]
  std::vector<int> store_of_;  // [model layer] store layer, or -1 (sliding)
  std::unique_ptr<SlidingRing> ring_;
  cuda::AttnShape attn_;
  RuntimeOptions opt_;
  RuntimeStats& stats_;
  route::KvPlacement placement_ = route::KvPlacement::host;
  int64_t pages_per_layer_ = 0;
  std::unique_ptr<cuda::DevicePagePool> pages_;    // gpu: every page; host, partial: each layer's tail page
  std::unique_ptr<cuda::DevicePagePool> resident_; // partial: full bf16 pages kept (taken at decode, freed at prefill)
  route::ResidencyPlan residency_;                 // partial: the pools' sizes per layer
  size_t budget_ = 0;                              // GPU budget for the history's device pages
  std::unique_ptr<cuda::DevicePagePool> prompt_;   // host: the prompt's pages (streamed: the chunk's) while prefill runs
  std::unique_ptr<PrefillStream> stream_;          // host, streamed prefill: the staging
  bool streamed_ = false;                          // the prefill in progress streams its history
  std::unique_ptr<cuda::DevicePagePool> encoded_;  // gpu: encoded pages the route reads; partial: those kept
  std::vector<std::vector<DevPage>> dev_;          // [layer][page] device copy of the bf16 page
  std::vector<std::vector<DevPage>> dev_encoded_;  // [layer][page] device copy of the encoded page
  std::vector<kv::CodecFormat> codecs_;            // the route's compressed format, if any
  std::unique_ptr<convert::ConversionPool> pool_;
  std::unique_ptr<convert::CompressedHistory> own_compressed_;  // this view's conversions, if it converts
  convert::CompressedHistory* compressed_ = nullptr;            // what the route reads: its own or an owner's
  // Device page tables [layer][page] for prefill attention, mirrored on the
  // host; changes go to the device as patches on the step's stream.
  const void** tables_dev_ = nullptr;
  std::vector<const void*> tables_host_;
  std::vector<size_t> dirty_;  // entries of tables_host_ changed since the last submit
  cuda::PatchBuffer patches_;
  std::optional<cuda::CoAttentionCalibration> calibration_;  // cpu_share auto, host placement
  std::optional<route::CpuRateFeedback> cpu_feedback_;        // auto: the CPU rates corrected by the steps
  route::CoAttentionPlan last_plan_;                          // auto: the last step's plan (its CPU pages per layer)
};

}  // namespace activekv::runtime
