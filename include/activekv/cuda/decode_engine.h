// GPU decode engine: attention of each decode step over the KV history, page
// by page, wherever each page lies -- streamed from pinned host memory (the
// one page store, activekv/kv/page_store.h) or read in place from a device
// copy -- with the paged kernels of decode_attention.h and format_kernels.h
// and the exact merge of SPEC §4.
//
// Pages
//   A page table entry is a PageRef: the page's pinned host bytes, optionally
//   a device copy, its size and its kind (bf16, int8s, lossless13), so one
//   sequence mixes formats page by page (the hybrid route, SPEC §2) and
//   places page by page: an entry with a device copy is *resident* (HBM time,
//   no transfer), one without is *streamed* (link time). The caller decides
//   (the runtime's placement, e.g. every page resident, or everything
//   streamed but the tail page the model is writing on the GPU).
//
// Per step (update + begin_step + enqueue_layer per layer)
//   update() takes the batch's page tables and lengths for the next step and
//   compares them with the last update's: only the work-list entries that
//   changed (the tail's growing split, a new page, a page whose route moved
//   to a published encoded copy) are written, as patches that one small
//   kernel scatters into the device work lists on the compute stream. No
//   host synchronisation (except when a capacity grows: then the engine
//   waits for its streams and reallocates, which is rare and amortised).
//   Per layer, the streamed entries (all sequences, sequence-major, page
//   order) are cut into *jobs* of `tile_pages` pages (0 = the layer in one
//   job); job k of a step is copied host -> device into ring slot k % R on
//   the copy stream -- every run of pages adjacent in host memory is ONE
//   cudaMemcpyAsync -- and attended on the compute stream. Events order them:
//   attention on job k waits for its copy; the next copy into its slot waits
//   for that attention. Copies run up to R-1 jobs ahead, so the copy of tile
//   k+1 overlaps attention on tile k, and layer l+1's first tile is copied
//   while layer l computes. The resident entries of a layer are one more job
//   that needs no copy.
//   Each job launches, on the compute stream, the lossless13 unpack (into one
//   bf16 scratch area), the bf16 split kernel over its bf16 and unpacked
//   pages, then the int8s split kernel over its int8s pages. Splits are
//   numbered by token position whatever the format or place, and the merge
//   takes them in ascending order.
//
// Sliding windows (EngineConfig::windows): a layer with window W attends, for
//   a sequence of n tokens (its query at position n - 1), only the keys
//   [max(0, n - W), n): pages before the one holding n - W are neither
//   checked, copied nor read (their table entries may be empty), and the
//   first visible page's splits start at n - W. Such a layer's splits are
//   numbered from its first visible split, so its merge takes only them. A
//   resident page needs no host bytes: a layer whose pages live only on the
//   GPU (Gemma 3's sliding layers, a ring of device pages) gives entries
//   with `device` set and `host` null.
//
// The host CPU's share (co-attention, issue 12): entries marked `cpu` are
//   attended in place by the CPU kernels (activekv/cpu/decode_attention.h)
//   while the GPU attends the rest; no history byte of them crosses the bus,
//   only their split partials, which land in the same split slots and go
//   through the same merge. Per layer, on a side stream: q is copied to the
//   host after it is ready, a host function runs the CPU attention, the
//   partials are copied back, and the compute stream waits for that one
//   event just before the layer's merge (details: src/cuda/cpu_share.h).
//
// Head shards (issue 15; sharded_engine.h runs N of them): with
//   attn.sharded() the engine attends KV heads [kv_head0, kv_head0 +
//   n_kv_heads) of whole pages (page_kv_heads heads: page_bytes() and the
//   codec headers are the whole page's). A streamed page moves only those
//   heads' ranges (kv::shard_byte_ranges), staged at their offsets in the
//   page; a resident page is read in place; queries, partials and outputs
//   hold the shard's heads only. `cpu` pages are refused (InvalidArgument).
//
// Exactness: wherever a page lies on the GPU, the same kernel reads the same
// bytes at the same split boundaries, and the merge runs in ascending split
// order, so streamed (any tile size), resident and mixed placements give
// bitwise identical outputs, repeatable run to run. A CPU-attended split is
// fp32 attention over the same keys by a different kernel (bf16 q.k with the
// query in two bf16 terms; int8s integer q.k as on the GPU): equal within
// fp32 summation order, bitwise repeatable for a fixed plan (the CPU result
// does not depend on its thread count).
//
// Not thread-safe. All device pointers are of the current CUDA device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "activekv/cpu/decode_attention.h"
#include "activekv/cuda/decode_attention.h"
#include "activekv/cuda/format_kernels.h"
#include "activekv/kv/codec_int8s.h"

namespace activekv::cuda {

struct JobPlan;  // internal: one job of one layer (decode_engine.cpp)
class CpuShare;  // internal: the CPU's share of a step (cpu_share.h)

/// How a page is stored (SPEC §3).
enum class PageKind : uint8_t {
  bf16,        ///< exact: the layout of decode_attention.h, AttnShape::page_bytes() bytes
  int8s,       ///< an int8s blob (activekv/kv/codec_int8s.h), read in place by the int8s kernel
  lossless13,  ///< a lossless13 blob, unpacked to bf16 on the GPU, then the bf16 kernel
};
/// "bf16" / "int8s" / "lossless13".
const char* page_kind_name(PageKind k);

/// Where one page of the history lies.
struct PageRef {
  const std::byte* host = nullptr;  ///< pinned host bytes (page store slot or blob), 16-byte aligned; may be
                                    ///< null for a bf16 page with a device copy (a GPU-only page)
  const void* device = nullptr;     ///< a device copy of the same bytes, or null: streamed
  uint64_t bytes = 0;               ///< page_bytes() for bf16; the blob size for the codecs
  PageKind kind = PageKind::bf16;
  /// Attended in place by the host CPU (bf16 pages and int8s blobs; `device`
  /// must be null). An int8s page needs `int8s_view`, the view its publisher
  /// parsed and validated once (kv::parse_int8s_page), alive as long as the page.
  bool cpu = false;
  const kv::Int8sPageView* int8s_view = nullptr;
  bool operator==(const PageRef&) const = default;
};

/// The history of one sequence as the engine sees it.
struct SeqPages {
  int64_t n_tokens = 0;                      ///< tokens written (the tail page may be partial)
  std::vector<std::vector<PageRef>> tables;  ///< [layer][page index]
};

struct EngineConfig {
  int n_layers = 0;
  AttnShape attn;
  int tile_pages = 32;  ///< streamed pages per job; 0 = a layer's streamed pages in one job
  /// [n_layers] sliding window of each layer in tokens (a query at p sees keys
  /// in (p - window, p]); 0 = the whole history. Empty: no layer slides.
  std::vector<int> windows;
  int ring_slots = 3;   ///< staging buffers (>= 2)
  /// Switches of the int8s kernel; with Int8sKernel::tc the constructor
  /// throws InvalidArgument for a group the tc kernel is not instantiated for.
  Int8sKernelOptions int8s;
  /// The CPU kernels for `cpu` pages: threads (0 = all OpenMP threads) and
  /// ISA. split_tokens and int8s_query_terms are taken from `attn` and `int8s`.
  cpu::CpuAttentionOptions cpu_kernels;
  /// A head shard's copies (attn.sharded()): its K planes and V planes of a
  /// bf16 page are two ranges of the stored page, its sections of an int8s
  /// page one. false: one cudaMemcpyAsync per range (two per bf16 page);
  /// true: the ranges of a run of adjacent pages, equal in width and evenly
  /// spaced, as ONE cudaMemcpy2DAsync (one per run). Which costs less link
  /// bandwidth is the H200's to say (bench decode --copy-2d).
  bool strided_copies = false;
  /// The stream the engine enqueues its attention (and patches, merges) on,
  /// created by the caller and not owned (it must outlive the engine); null:
  /// the engine creates its own. Several engines on one stream (the GPU
  /// runtime's sequences sharing a model, activekv/runtime/gpu_model.h) order
  /// their steps by that stream; each keeps its own copy stream and events.
  cudaStream_t compute_stream = nullptr;
  /// A job with both bf16 and int8s pages (the hybrid route): the int8s
  /// kernel runs on a side stream, forked from the compute stream by an event
  /// recorded before the bf16 kernel (so it does not wait for it), launched
  /// after it, and joined back before the merge, so the
  /// bf16 kernel's few long CTAs (the sink, recent and tail pages) overlap
  /// the int8s kernel instead of running before it (issue 13). They write
  /// disjoint partials, so the bits are the same either way. false: both on
  /// the compute stream, one after the other.
  bool overlap_formats = true;
};

/// Whether two configurations are the same engine, every field compared
/// (a field added to EngineConfig or its parts fails a static_assert in
/// decode_engine.cpp until it is compared). GpuModel::decode_batch lets
/// sequences share one engine only when this holds.
bool same_engine_config(const EngineConfig& a, const EngineConfig& b);

class DecodeEngine {
 public:
  /// Creates the streams and events. Throws InvalidArgument for a bad config,
  /// CudaError when the GPU cannot be used.
  explicit DecodeEngine(const EngineConfig& cfg);
  ~DecodeEngine();
  DecodeEngine(const DecodeEngine&) = delete;
  DecodeEngine& operator=(const DecodeEngine&) = delete;

  /// Sets the batch of the next step: one SeqPages per sequence. Entries that
  /// are new or changed since the last update (a windowed layer: only those
  /// from its first visible page on) are checked, without reading a codec
  /// payload: host pointer present (or, bf16 only, a device copy), 16-byte
  /// aligned, a bf16 page of
  /// page_bytes(), a codec blob whose header matches its kind and the shape,
  /// an int8s page that is full, enough pages for n_tokens, and at most
  /// kMaxMergeSplits splits. Throws InvalidArgument naming sequence, layer and
  /// page; after a failure the engine holds no batch (a step throws until an
  /// update succeeds). The pages' bytes must stay valid and unchanged (but for
  /// tokens written past the old n_tokens) until the step that reads them ends.
  void update(const std::vector<SeqPages>& seqs);

  /// Enqueues one decode step over every layer, no host synchronisation.
  /// q:   device fp32 [n_layers][n_seq][n_q_heads][head_dim]
  /// out: device fp32, same shape; out_lse: device fp32 [n_layers][n_seq][n_q_heads] or null.
  /// Work is ordered after everything already on compute_stream().
  void enqueue_step(const float* q, float* out, float* out_lse);

  /// Per-layer form of enqueue_step: call begin_step(), then enqueue_layer for
  /// layers 0..n_layers-1 in order (q/out of that layer: [n_seq][n_q_heads][head_dim]).
  /// Other work (the model's layers) may be put on compute_stream() between them.
  /// out_int8 (launch_merge): out also as int8 blocks for the output projection.
  void begin_step();
  void enqueue_layer(int layer, const float* q, float* out, float* out_lse, Int8Blocks out_int8 = {});

  cudaStream_t compute_stream() const { return compute_; }
  cudaStream_t copy_stream() const { return copy_; }
  /// Waits for all enqueued work (host sync; between steps only). Rethrows an
  /// error the CPU share hit in a step (that step's output is NaN).
  void synchronize();
  /// Rethrows (once) an error the CPU share hit, without waiting: call it
  /// once a step's output was waited for (its sampled token, say) and before
  /// the step is kept, so that a failed step's NaN never reaches the history.
  void check_cpu_error();

  /// Host -> device bytes one step moves, its copy calls (cudaMemcpyAsync or
  /// cudaMemcpy2DAsync) and the largest one, and the contiguous rows those
  /// calls move (= calls without 2D copies).
  size_t bytes_per_step() const { return bytes_per_step_; }
  size_t copies_per_step() const { return copies_per_step_; }
  size_t largest_copy() const { return largest_copy_; }
  size_t copy_rows_per_step() const { return copy_rows_per_step_; }
  /// Bytes of resident pages one step reads in place (the whole page, but a
  /// windowed layer's first visible page only from its first visible token).
  size_t resident_bytes_per_step() const { return resident_bytes_per_step_; }
  /// Bytes of history the host CPU reads in one step (`cpu` pages).
  size_t cpu_bytes_per_step() const;
  /// Host-clock timing of the CPU's share (co-attention) since the last
  /// reset: what the planner's model assumes, measured (issue 12). Zero
  /// without a CPU share.
  struct CpuTiming {
    double busy_ms = 0;  ///< inside the CPU attention of a layer, summed
    double idle_ms = 0;  ///< from one layer's CPU end to the next layer's CPU start within a step, summed:
                         ///< partials up, the GPU's merge, q of the next layer down, the host function's start
    size_t layers = 0;   ///< layer tasks run
    size_t steps = 0;    ///< steps (tasks of layer 0)
    size_t bytes = 0;    ///< history bytes those tasks read
  };
  CpuTiming cpu_timing() const;
  void reset_cpu_timing();
  /// One sequence's part of the step's figures above (the batch of the last
  /// update(); `seq` indexes it): host -> device bytes of its streamed pages
  /// and the copy calls they start (a page that extends a copy of the page
  /// before it adds bytes, not a call), bytes of its resident pages read in
  /// place, of those the bytes in windowed layers, and the bytes the host CPU
  /// reads of it. Summed over the batch they are bytes_per_step(),
  /// copies_per_step(), resident_bytes_per_step() and cpu_bytes_per_step().
  /// Throws InvalidArgument without a batch or for `seq` outside it.
  struct SeqFigures {
    size_t streamed = 0, copies = 0, resident = 0, windowed_resident = 0, cpu = 0;
  };
  const SeqFigures& sequence_figures(size_t seq) const;
  /// The same two figures per layer: [n_layers] host -> device bytes, resident bytes.
  const std::vector<size_t>& layer_streamed_bytes() const { return layer_streamed_; }
  const std::vector<size_t>& layer_resident_bytes() const { return layer_resident_; }
  /// Layer l's window (0: the whole history).
  int window(int layer) const { return cfg_.windows.empty() ? 0 : cfg_.windows[size_t(layer)]; }
  /// Work-list entries the last update() rewrote (0 when nothing changed).
  size_t last_patch_entries() const { return last_patches_; }
  const EngineConfig& config() const { return cfg_; }

  /// What one job of `layer` does, for the transfer model: its copies (bytes
  /// each; empty for the resident job), the tokens it attends per page kind
  /// and its kernels' splits.
  struct JobInfo {
    std::vector<size_t> copy_bytes;         ///< bytes of each copy call
    std::vector<size_t> copy_rows;          ///< its contiguous rows (1 but for a 2D copy)
    int64_t tokens = 0;                     ///< all kinds
    int64_t tokens_by_kind[3] = {0, 0, 0};  ///< indexed by PageKind
    int n_work = 0;
    bool resident = false;
  };
  std::vector<JobInfo> job_info(int layer) const;
  /// Jobs of `layer` (resident job included when the layer has resident pages).
  int jobs_in_layer(int layer) const;

 private:
  struct Plan;
  struct Device;
  void apply(std::unique_ptr<Plan> plan);
  void enqueue_copy(int64_t k);
  void launch_job(const JobPlan& j, const float* q);

  EngineConfig cfg_;
  cudaStream_t compute_ = nullptr, copy_ = nullptr;
  bool own_compute_ = false;  // compute_ created here (EngineConfig::compute_stream null)
  cudaStream_t side_ = nullptr;                      // the int8s kernel of a mixed job (overlap_formats)
  void* fork_ = nullptr;                             // cudaEvent_t: compute_ -> side_
  void* join_ = nullptr;                             // cudaEvent_t: side_ -> compute_
  std::vector<void*> events_copy_, events_compute_;  // cudaEvent_t, per ring slot
  std::unique_ptr<Plan> plan_;                       // of the last successful update()
  std::unique_ptr<Device> dev_;
  std::unique_ptr<CpuShare> cpu_;                    // made by the first update() with a `cpu` page
  size_t bytes_per_step_ = 0, copies_per_step_ = 0, largest_copy_ = 0, resident_bytes_per_step_ = 0;
  size_t copy_rows_per_step_ = 0;
  std::vector<size_t> layer_streamed_, layer_resident_;
  size_t last_patches_ = 0;
  int next_layer_ = 0;
  int64_t ring_job_ = 0;         // streamed jobs attended in this step
  int64_t copies_enqueued_ = 0;  // streamed jobs whose copy is enqueued in this step
  bool ready_ = false;
};

}  // namespace activekv::cuda
