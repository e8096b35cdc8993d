// Internal to the GPU runtime: one decode step's GPU work as a CUDA graph
// (RuntimeOptions::cuda_graphs).
//
// Every step is captured again (stream capture, relaxed mode) and the graph
// instantiated once is brought up to date with cudaGraphExecUpdate; it is
// re-instantiated only when the update refuses (the topology changed: a
// different number of attention jobs, a job with no int8s pages any more, ...).
//
// Why capture every step rather than keep one graph and make the changing
// values device-side: a step's kernel arguments change every step (the
// positions pointer pos + pos0, kv_write's slot and page pointers) and at
// split boundaries (the attention kernels' work counts and grids). Making
// them device-side means new kernel signatures for RoPE, kv_write and the
// split kernels (their grids sized on the device, or for the worst case):
// kernel changes this step is not to make. Capture costs host time instead,
// on paper (Hopper, CUDA 12/13 figures as published by NVIDIA and measured
// by others; to be confirmed by the lead's bench on the H200):
//   eager:    ~330 cudaLaunchKernel x ~2.5-4 us of host time each, the GPU
//             idling between short kernels: ~1-1.3 ms of launch time, the
//             critical path at depth 0 (2.87 ms measured, 0.70 ms floor);
//   captured: ~330 captured nodes x ~0.5-1 us + cudaGraphExecUpdate ~330 x
//             ~0.2-0.5 us + one cudaGraphLaunch (~5-10 us), then the GPU runs
//             the nodes back to back (~1 us less per kernel than stream launches).
// The capture is not overlapped with the GPU (the graph launches once it is
// complete), so the win is launch time minus capture+update time plus the
// GPU-side gaps; if capture shows up as the limit, device-side arguments are
// the next step (the graph then relaunched as is: ~10 us of host per step).
//
// Not thread-safe; one stream.
#pragma once

#include <cstddef>
#include <functional>

typedef struct CUstream_st* cudaStream_t;
typedef struct CUgraph_st* cudaGraph_t;
typedef struct CUgraphExec_st* cudaGraphExec_t;

namespace activekv::runtime {

class StepGraph {
 public:
  StepGraph() = default;
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  /// Captures what `enqueue` puts on `stream` (which must not be capturing,
  /// nor be the legacy default stream) and brings the executable graph up to
  /// date with it; nothing runs. `enqueue` must only enqueue asynchronous,
  /// capturable work on `stream` (kernels, device copies, copies to pinned
  /// memory): no host synchronisation, no events of other streams, no
  /// uploads from pageable memory. If `enqueue` throws or the capture fails,
  /// the capture is ended, the partial graph dropped, and the error rethrown
  /// (CudaError for a failed capture or instantiation).
  void capture(cudaStream_t stream, const std::function<void()>& enqueue);
  /// Launches the last captured step on `stream`. Throws CudaError.
  void launch(cudaStream_t stream);

  /// Steps captured, and how many of them needed a new instantiation.
  size_t captures() const { return captures_; }
  size_t instantiations() const { return instantiations_; }

 private:
  cudaGraphExec_t exec_ = nullptr;
  size_t captures_ = 0, instantiations_ = 0;
};

}  // namespace activekv::runtime
