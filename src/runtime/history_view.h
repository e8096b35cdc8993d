// Internal to the GPU runtime: the KV history of one sequence as the GPU
// sees it -- which pages have device copies (placement), which published
// encoded pages the route reads, the page tables handed to the decode engine
// and to prefill attention, and the writes of new tokens' K/V.
#pragma once

#include <memory>
#include <vector>

#include "activekv/convert/compressed_history.h"
#include "activekv/cuda/decode_engine.h"
#include "activekv/cuda/device_pages.h"
#include "activekv/cuda/patch.h"
#include "activekv/kv/page_store.h"
#include "activekv/runtime/gpu_runtime.h"

namespace activekv::runtime {

class HistoryView {
 public:
  /// Chooses the placement (stats.placement) from opt and the GPU memory
  /// free now, and takes the device pages it needs. Throws Error when
  /// --kv-placement gpu does not fit.
  HistoryView(kv::SequenceKv& seq, const cuda::AttnShape& attn, const RuntimeOptions& opt, RuntimeStats& stats);
  ~HistoryView();
  HistoryView(const HistoryView&) = delete;
  HistoryView& operator=(const HistoryView&) = delete;

  /// A prefill will bring the history to `n_tokens`: with host placement,
  /// takes device pages for the prompt's history (Error with the sizes when
  /// they do not fit the GPU).
  void begin_prefill(int64_t n_tokens);
  /// Before rows [pos0, pos0 + T) are written (pages reserved in the
  /// sequence): gives every page the step reads or writes a device copy
  /// where the placement wants one (uploading tokens already written).
  void prepare(int64_t pos0, int T, bool prefill, cudaStream_t s);
  /// Stores K/V of rows [pos0, pos0 + T) of `layer` (device fp32
  /// [T][n_kv_heads*head_dim]) as bf16 into the device copies and the host pages.
  void write_kv(int layer, int64_t pos0, int T, const float* k, const float* v, cudaStream_t s);
  /// The engine's page tables for a step over `n_tokens` tokens, along the
  /// route (uploading, with gpu placement, published encoded pages not yet
  /// on the GPU); adds what the step reads to stats.pages.
  std::vector<cuda::SeqPages> engine_tables(int64_t n_tokens, cudaStream_t s);
  /// Device array of the device addresses of `layer`'s pages covering
  /// `n_tokens` (prefill attention's page table; kept up to date by prepare()).
  const void* const* device_pages(int layer, int64_t n_tokens) const;
  /// After a commit: queues conversion of pages that became full.
  void committed();
  /// Waits until every queued conversion has published its page.
  void wait_conversions();
  /// After the prompt: with host placement, frees the prompt's device pages
  /// but each layer's tail.
  void prefill_done(cudaStream_t s);

 private:
  struct DevPage {
    std::byte* ptr = nullptr;
    cuda::DevicePagePool* pool = nullptr;
  };
  void give_copy(int layer, size_t page, cuda::DevicePagePool& pool, bool upload, cudaStream_t s);
  void drop_copy(int layer, size_t page);
  void set_copy(int layer, size_t page, DevPage d);
  const std::byte* host_page(int layer, size_t page) const;
  bool host_placement() const { return placement_ == route::KvPlacement::host; }

  kv::SequenceKv& seq_;
  cuda::AttnShape attn_;
  RuntimeOptions opt_;
  RuntimeStats& stats_;
  route::KvPlacement placement_ = route::KvPlacement::host;
  int64_t pages_per_layer_ = 0;
  std::unique_ptr<cuda::DevicePagePool> pages_;    // gpu: every page; host: each layer's tail page
  std::unique_ptr<cuda::DevicePagePool> prompt_;   // host: the prompt's pages while prefill runs
  std::unique_ptr<cuda::DevicePagePool> encoded_;  // gpu: encoded pages the route reads
  std::vector<std::vector<DevPage>> dev_;          // [layer][page] device copy of the bf16 page
  std::vector<std::vector<DevPage>> dev_encoded_;  // [layer][page] device copy of the encoded page
  std::vector<kv::CodecFormat> codecs_;            // the route's compressed format, if any
  std::unique_ptr<convert::ConversionPool> pool_;
  std::unique_ptr<convert::CompressedHistory> compressed_;
  // Device page tables [layer][page] for prefill attention, mirrored on the
  // host; changes go to the device as patches on the step's stream.
  const void** tables_dev_ = nullptr;
  std::vector<const void*> tables_host_;
  std::vector<cuda::Patch> pending_;
  cuda::PatchBuffer patches_;
};

}  // namespace activekv::runtime
