// GPU decode engine: the KV history in pinned host memory, streamed to the GPU
// every decode step (or held resident in GPU memory), attended with the paged
// BF16 kernel of decode_attention.h and merged per SPEC §4.
//
// Host side
//   PinnedPagePool: one cudaHostAlloc'ed slab of `n_pages` pages of
//   AttnShape::page_bytes() bytes each, page `id` at data() + id * page_bytes.
//   The page layout is the host page store's (activekv/kv/page_store.h):
//   K planes [n_kv_heads][page_size][head_dim], then V planes, bf16.
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
//   The pool is copied to GPU memory once (constructor); a step launches one
//   attention kernel per layer over all sequences (batched decode) and one
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

namespace activekv::cuda {

/// A pool of pages in pinned (page-locked) host memory.
class PinnedPagePool {
 public:
  /// Allocates n_pages * page_bytes with cudaHostAlloc. Throws InvalidArgument
  /// for zero sizes and CudaError (naming the byte count) when pinning fails.
  PinnedPagePool(size_t page_bytes, size_t n_pages);
  ~PinnedPagePool();
  PinnedPagePool(const PinnedPagePool&) = delete;
  PinnedPagePool& operator=(const PinnedPagePool&) = delete;

  std::byte* data() const { return data_; }
  std::byte* page(uint32_t id) const { return data_ + size_t(id) * page_bytes_; }
  size_t page_bytes() const { return page_bytes_; }
  size_t n_pages() const { return n_pages_; }

 private:
  std::byte* data_ = nullptr;
  size_t page_bytes_ = 0, n_pages_ = 0;
};

/// The history of one sequence as the engine sees it.
struct SeqPages {
  int64_t n_tokens = 0;                       ///< tokens written (the tail page may be partial)
  std::vector<std::vector<uint32_t>> tables;  ///< [layer][page index] -> pool page id
};

enum class Mode { resident, streamed };

struct EngineConfig {
  int n_layers = 0;
  AttnShape attn;
  Mode mode = Mode::streamed;
  int tile_pages = 32;  ///< pages per staging job; 0 = whole layer (all sequences) per job
  int ring_slots = 3;   ///< staging buffers (>= 2)
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
  /// outside a step. Throws InvalidArgument for a table that is too short, a
  /// page id outside the pool, a layer count that does not match, or an empty batch.
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
  /// each, empty in resident mode), the tokens it attends and its kernel's splits.
  struct JobInfo { std::vector<size_t> copy_bytes; int64_t tokens = 0; int n_work = 0; };
  std::vector<JobInfo> job_info(int layer) const;

 private:
  struct Run { size_t host_off, stage_off, bytes; };
  struct Job {
    std::vector<std::vector<Run>> runs;  // [layer]
    std::vector<size_t> work_off;        // [slot] (streamed) or [layer] (resident), into work_dev_
    int n_work = 0;
    int64_t tokens = 0;
  };
  void ensure_copies(int64_t upto);
  void enqueue_copy(int64_t k);
  void free_device();

  EngineConfig cfg_;
  const PinnedPagePool* pool_;
  int n_seq_ = 0;
  cudaStream_t compute_ = nullptr, copy_ = nullptr;
  std::vector<void*> events_copy_, events_compute_;  // cudaEvent_t, per slot
  std::byte* dev_pool_ = nullptr;                     // resident
  std::byte* staging_ = nullptr;                      // streamed: ring_slots * job_pages pages
  SplitWork* work_dev_ = nullptr;
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
};

/// Uniform random bf16 values in [-1, 1) from a fixed seed, written with
/// `threads` host threads (deterministic for a given seed regardless of threads).
void fill_random_bf16(std::byte* data, size_t bytes, uint64_t seed, int threads);

}  // namespace activekv::cuda
