// GPU decode engine: the KV history in pinned host memory, streamed to the GPU
// every decode step (or held resident in GPU memory), attended with the paged
// BF16 kernel of decode_attention.h and merged per SPEC §4.
//
// Host side
//   PinnedPagePool: one cudaHostAlloc'ed slab: bf16 page slots of
//   AttnShape::page_bytes() bytes (the host page store's layout,
//   activekv/kv/page_store.h: K planes [n_kv_heads][page_size][head_dim], then
//   V planes) and an arena for encoded pages (int8s, lossless13 blobs).
//   A page table entry is a PageRef (offset, bytes, kind), so one sequence can
//   mix formats page by page: that is the hybrid route (SPEC §2), e.g. bf16
//   sink, recent window and tail with int8s pages between them.
//
// Formats (SPEC §3): each job launches, on the compute stream, the lossless13
//   unpack (into one bf16 scratch area), then the bf16 split kernel over its
//   bf16 and unpacked pages, then the int8s split kernel over its int8s pages.
//   Splits are numbered by token position whatever the format, and the merge
//   takes them in ascending order, so tiles merge in token order.
//
// Streaming (Mode::streamed), SPEC §7
//   Each layer's pages (all sequences of the batch, sequence-major, page order)
//   are cut into *jobs* of `tile_pages` pages (0 = the whole layer in one job:
//   "whole-layer staging"). A job is copied host -> device into one slot of a
//   ring of `ring_slots` device staging buffers on the copy stream -- every run
//   of consecutive page ids is ONE cudaMemcpyAsync, so a sequence whose pages
//   are allocated contiguously moves as a single large transfer -- and attended
//   on the compute stream. Events order them: attention on job k waits for its
//   copy; the copy of job k+R into the same slot waits for attention on job k.
//   Copies run up to R-1 jobs ahead of attention, so the copy of tile k+1
//   overlaps attention on tile k, and layer l+1's first tile is copied while
//   layer l computes. The host never synchronises inside a step.
//
// Resident (Mode::resident)
//   The pool's used bytes are copied to GPU memory once (constructor: pages
//   allocated later are not resident, and set_batch rejects them); a step
//   launches one job per layer over all sequences (batched decode) and one
//   merge. No transfer.
//
// Exactness: every mode cuts the history at the same split boundaries and
// merges in ascending split order, so streamed (any tile size) and resident
// outputs are bitwise identical, and repeatable run to run.
//
// Not thread-safe. All device pointers are of the current CUDA device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "activekv/cuda/decode_attention.h"
#include "activekv/cuda/format_kernels.h"

namespace activekv::cuda {

/// How a page of the pool is stored (SPEC §3).
enum class PageKind : uint8_t {
  bf16,        ///< exact: the layout above, AttnShape::page_bytes() bytes
  int8s,       ///< an int8s blob (activekv/kv/codec_int8s.h), read in place by the int8s kernel
  lossless13,  ///< a lossless13 blob, unpacked to bf16 on the GPU, then the bf16 kernel
};
/// "bf16" / "int8s" / "lossless13".
const char* page_kind_name(PageKind k);

/// Where one page of the history lies in the pinned pool.
struct PageRef {
  uint64_t offset = 0;  ///< bytes from PinnedPagePool::data(), 256-byte aligned
  uint64_t bytes = 0;   ///< page_bytes() for bf16; the blob size for the codecs
  PageKind kind = PageKind::bf16;
};

/// The host history in pinned (page-locked) memory: `n_pages` fixed bf16
/// page slots (page `id` at data() + id * page_bytes), followed by an arena
/// of `extra_bytes` for encoded pages of any size (allocate()).
class PinnedPagePool {
 public:
  /// Allocates n_pages * page_bytes + extra_bytes with cudaHostAlloc. Throws
  /// InvalidArgument for a zero page size or an empty pool and CudaError
  /// (naming the byte count) when pinning fails.
  PinnedPagePool(size_t page_bytes, size_t n_pages, size_t extra_bytes = 0);
  ~PinnedPagePool();
  PinnedPagePool(const PinnedPagePool&) = delete;
  PinnedPagePool& operator=(const PinnedPagePool&) = delete;

  std::byte* data() const { return data_; }
  std::byte* page(uint32_t id) const { return data_ + size_t(id) * page_bytes_; }
  std::byte* at(const PageRef& r) const { return data_ + r.offset; }
  /// The bf16 page slot `id` as a PageRef. Throws InvalidArgument past n_pages().
  PageRef page_ref(uint32_t id) const;
  /// Reserves `bytes` (256-byte aligned) in the arena for a page of `kind`.
  /// Throws InvalidArgument naming the sizes when the arena is full.
  PageRef allocate(size_t bytes, PageKind kind);
  size_t page_bytes() const { return page_bytes_; }
  size_t n_pages() const { return n_pages_; }
  /// Bytes of the pool in use: the page slots plus the arena used so far.
  size_t used_bytes() const { return used_; }
  size_t capacity_bytes() const { return capacity_; }

 private:
  std::byte* data_ = nullptr;
  size_t page_bytes_ = 0, n_pages_ = 0, used_ = 0, capacity_ = 0;
};

/// The history of one sequence as the engine sees it.
struct SeqPages {
  int64_t n_tokens = 0;                      ///< tokens written (the tail page may be partial)
  std::vector<std::vector<PageRef>> tables;  ///< [layer][page index] -> page in the pool
};

enum class Mode { resident, streamed };

struct EngineConfig {
  int n_layers = 0;
  AttnShape attn;
  Mode mode = Mode::streamed;
  int tile_pages = 32;  ///< pages per staging job; 0 = whole layer (all sequences) per job
  int ring_slots = 3;   ///< staging buffers (>= 2)
  Int8sKernelOptions int8s;  ///< switches of the int8s kernel
};

class DecodeEngine {
 public:
  /// Resident mode copies the whole pool to GPU memory here (synchronously).
  /// Throws InvalidArgument for a bad config, CudaError on allocation failure.
  DecodeEngine(const EngineConfig& cfg, const PinnedPagePool& pool);
  ~DecodeEngine();
  DecodeEngine(const DecodeEngine&) = delete;
  DecodeEngine& operator=(const DecodeEngine&) = delete;

  /// Sets the batch (sequences, their page tables and lengths); builds and
  /// uploads the work lists and sizes the staging ring. Synchronous; call it
  /// outside a step. Throws InvalidArgument, naming sequence, layer and page,
  /// for an empty batch, a layer count that does not match, a table that is
  /// too short, a page outside the pool (or outside what a resident engine
  /// copied), a bf16 page of the wrong size, a codec page whose header does
  /// not match its kind, the shape or its size, an int8s page that is not
  /// full, or more splits than the merge takes. After a failure the engine
  /// holds no batch (a step throws until set_batch succeeds).
  void set_batch(const std::vector<SeqPages>& seqs);

  /// Enqueues one decode step over every layer, no host synchronisation.
  /// q:   device fp32 [n_layers][n_seq][n_q_heads][head_dim]
  /// out: device fp32, same shape; out_lse: device fp32 [n_layers][n_seq][n_q_heads] or null.
  /// Work is ordered after everything already on compute_stream().
  void enqueue_step(const float* q, float* out, float* out_lse);

  /// Per-layer form of enqueue_step: call begin_step(), then enqueue_layer for
  /// layers 0..n_layers-1 in order (q/out of that layer: [n_seq][n_q_heads][head_dim]).
  void begin_step();
  void enqueue_layer(int layer, const float* q, float* out, float* out_lse);

  cudaStream_t compute_stream() const { return compute_; }
  cudaStream_t copy_stream() const { return copy_; }
  /// Waits for all enqueued work (host sync; between steps only).
  void synchronize();

  /// Host -> device bytes one step moves (0 in resident mode).
  size_t bytes_per_step() const { return bytes_per_step_; }
  /// Number of cudaMemcpyAsync calls per step and the largest one, in bytes.
  size_t copies_per_step() const { return copies_per_step_; }
  size_t largest_copy() const { return largest_copy_; }
  /// Jobs (kernel launches) per layer, pages per job.
  int jobs_per_layer() const { return int(jobs_.size()); }
  int job_pages() const { return job_pages_; }
  const EngineConfig& config() const { return cfg_; }

  /// What one job of `layer` does, for the transfer model: its copies (bytes
  /// each, empty in resident mode), the tokens it attends per page kind and
  /// its kernels' splits.
  struct JobInfo {
    std::vector<size_t> copy_bytes;
    int64_t tokens = 0;          ///< all kinds
    int64_t tokens_by_kind[3] = {0, 0, 0};  ///< indexed by PageKind
    int n_work = 0;
  };
  std::vector<JobInfo> job_info(int layer) const;

 private:
  struct Run { size_t host_off, stage_off, bytes; };
  struct List { size_t off = 0; int n = 0; };  // a slice of work_dev_ / unpack_dev_
  struct Lists { List bf16, int8s, unpack; };
  struct Job {
    std::vector<std::vector<Run>> runs;  // [layer]
    std::vector<Lists> lists;            // [slot * n_layers + layer] (streamed) or [layer] (resident)
    std::vector<JobInfo> info;           // [layer]
  };
  void ensure_copies(int64_t upto);
  void enqueue_copy(int64_t k);
  void launch_job(const Lists& lists, const float* q);
  void free_device();

  EngineConfig cfg_;
  const PinnedPagePool* pool_;
  int n_seq_ = 0;
  cudaStream_t compute_ = nullptr, copy_ = nullptr;
  std::vector<void*> events_copy_, events_compute_;  // cudaEvent_t, per slot
  std::byte* dev_pool_ = nullptr;                     // resident
  size_t resident_bytes_ = 0;                         // bytes of the pool copied to dev_pool_
  std::byte* staging_ = nullptr;                      // streamed: ring_slots * job_pages pages
  SplitWork* work_dev_ = nullptr;
  UnpackWork* unpack_dev_ = nullptr;
  std::byte* unpack_scratch_ = nullptr;  // bf16 pages of one job's lossless13 pages
  size_t stage_slot_bytes_ = 0;
  int32_t* n_splits_dev_ = nullptr;
  Partials partials_{};
  std::vector<Job> jobs_;
  int job_pages_ = 0;
  size_t bytes_per_step_ = 0, copies_per_step_ = 0, largest_copy_ = 0;
  // step state
  int64_t jobs_enqueued_copy_ = 0;   // within the current step
  int64_t slot_base_ = 0;            // global job counter at step start
  int next_layer_ = 0;
  bool any_step_ = false;
  bool ready_ = false;               // a batch is set (set_batch succeeded)
};

}  // namespace activekv::cuda
