// Internal to the decode engine: the host CPU's share of a decode step
// (issue 12 part 2, co-attention). Pages the page table marks `cpu` are
// attended in place in pinned host memory by the CPU kernels of
// activekv/cpu/decode_attention.h; only their partials -- (O, LSE) per split
// and query head, kilobytes -- cross the bus, into the engine's partial slots
// beside the GPU's, and the engine's one merge joins all of them in token
// order (SPEC §4).
//
// Per layer, on a side stream, ordered by two events and nothing else:
//   compute: ... q of layer l ready --(event)--> side: copy q device -> pinned
//   side:    host function: the CPU attends layer l's CPU pages (OpenMP)
//            and merges each run of consecutive splits into one partial
//   side:    a small kernel reads those partials in mapped pinned memory and
//            writes them to their runs' first split slots on the device (the
//            run's other slots: empty, LSE = -inf)
//   side:    --(event)--> compute waits just before layer l's merge
// Why a kernel and not cudaMemcpyAsync: host -> device copies queue on the
// copy engine behind the streamed pages' copies (tens of MiB each). Measured
// on the H200 at c9cec5f (bench decode, bf16 streamed + CPU share): the CPU
// idled 0.30 ms (32K) and 0.68 ms (128K) per layer transition in a step,
// against 0.07 ms for the same round trip with no page copies in flight.
// Why merge on the host: the kernel's reads cross the bus too, one row of
// n_q_heads x head_dim floats per split (24 KiB for the 27B shape; 4.4 MiB a
// layer at 128K with 70 % on the CPU), on the CPU's critical path between
// layers. Merged, a run sends one row. ACTIVEKV_CPU_PARTIALS=splits sends
// every split's row as before (an A/B switch for that measurement).
// The GPU's jobs of layer l (streamed and resident) run meanwhile; the host
// thread that enqueues never waits. The host function runs on the CUDA
// driver's callback thread and makes no CUDA call; an exception there is kept
// and rethrown by the next synchronize() (the step's output is then NaN).
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include "activekv/cpu/decode_attention.h"
#include "activekv/cuda/decode_attention.h"
#include "activekv/cuda/decode_engine.h"
#include "cpu_partials.h"

namespace activekv::cuda {

/// One layer's CPU work, all sequences of the batch.
struct CpuLayerWork {
  struct Seq {
    int seq = 0;
    std::vector<cpu::PageRef> pages;  ///< token order
    size_t stage_row = 0;             ///< first staging row (split) of its partials
  };
  /// Consecutive splits of one sequence: staging rows [stage_row, stage_row +
  /// count) go to its split slots [split0, split0 + count).
  struct Run {
    int seq = 0;
    int32_t split0 = 0, count = 0;
    size_t stage_row = 0;
  };
  std::vector<Seq> seqs;
  std::vector<Run> runs;
  size_t rows = 0;   ///< splits in all
  size_t bytes = 0;  ///< history bytes the CPU reads (cpu::history_bytes)
};

/// The CPU work of every layer of a step. Immutable once built: host
/// functions still in flight keep the one they were enqueued with alive.
struct CpuStepWork {
  std::vector<CpuLayerWork> layers;
  size_t max_rows = 0;
  size_t bytes = 0;
};

class CpuShare {
 public:
  /// `opt.split_tokens` must equal shape.split_tokens (the split slots are shared).
  CpuShare(const AttnShape& shape, const cpu::CpuAttentionOptions& opt);
  ~CpuShare();
  CpuShare(const CpuShare&) = delete;
  CpuShare& operator=(const CpuShare&) = delete;

  /// Work of the next steps for a batch of n_seq sequences; grows the pinned
  /// staging (after waiting for the side stream) when it is too small.
  void set_work(std::shared_ptr<const CpuStepWork> work, int n_seq);
  bool has_work(int layer) const;
  size_t bytes_per_step() const { return work_ ? work_->bytes : 0; }

  /// Start of layer `layer`: q (device, [n_seq][n_q_heads][head_dim]) is ready
  /// on `compute`. Enqueues the side stream's copy, CPU attention and partial
  /// copies into `parts`.
  void start_layer(int layer, const float* q, Partials parts, cudaStream_t compute);
  /// Before the layer's merge: `compute` waits for the CPU partials.
  void join_layer(cudaStream_t compute);
  /// Waits for the side stream; rethrows (once) an error a host function caught.
  void synchronize();
  /// Rethrows (once) an error a host function caught, without waiting.
  void rethrow_error();
  /// Host-clock timing of the host functions since reset_timing()
  /// (DecodeEngine::CpuTiming). Read after synchronize() for whole steps.
  DecodeEngine::CpuTiming timing() const;
  void reset_timing();

 private:
  struct Task;
  static void CUDART_CB host_fn(void* task);
  void run(const CpuLayerWork& w, int layer) noexcept;
  void free_staging();

  AttnShape shape_;
  cpu::CpuAttentionOptions opt_;
  cudaStream_t side_ = nullptr;
  cudaEvent_t q_ready_ = nullptr, done_ = nullptr;
  std::shared_ptr<const CpuStepWork> work_;
  int n_seq_ = 0;
  float* q_host_ = nullptr;  // pinned [n_seq][n_q_heads][head_dim]
  float* stage_o_ = nullptr;  // pinned and mapped [rows][n_q_heads][head_dim]
  float* stage_lse_ = nullptr;  // pinned and mapped [rows][n_q_heads]
  const float* dev_stage_o_ = nullptr;    // their device addresses (the gather kernel's reads)
  const float* dev_stage_lse_ = nullptr;
  size_t cap_seq_ = 0, cap_rows_ = 0;
  cpu::CpuAttentionWorkspace ws_;  // used by the host functions only (one at a time: one side stream)
  std::vector<cpu::SplitRange> ranges_;  // the host functions' runs as merge ranges
  bool merge_runs_ = true;               // false: ACTIVEKV_CPU_PARTIALS=splits
  std::mutex error_mutex_;
  std::exception_ptr error_;
  mutable std::mutex timing_mutex_;
  DecodeEngine::CpuTiming timing_;
  std::chrono::steady_clock::time_point last_end_{};  // the previous task's end
  int last_layer_ = -1;                               // and its layer (-1: none since the reset)
};

}  // namespace activekv::cuda
