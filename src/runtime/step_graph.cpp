// See step_graph.h.
#include "step_graph.h"

#include <cuda_runtime.h>

#include "activekv/cuda/decode_attention.h"

namespace activekv::runtime {
namespace {

// Owns a captured graph until it is destroyed (the executable graph keeps
// what it needs).
struct GraphHolder {
  cudaGraph_t g = nullptr;
  ~GraphHolder() {
    if (g) cudaGraphDestroy(g);
  }
};

}  // namespace

StepGraph::~StepGraph() {
  if (exec_) cudaGraphExecDestroy(exec_);
}

void StepGraph::capture(cudaStream_t stream, const std::function<void()>& enqueue) {
  // Relaxed: other threads (background page conversion) may call CUDA while
  // this thread captures; nothing unsafe is called on the captured stream.
  cuda::check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
  GraphHolder graph;
  try {
    enqueue();
  } catch (...) {
    cudaStreamEndCapture(stream, &graph.g);  // leave the stream usable; the partial graph is dropped
    cudaGetLastError();                      // an invalidated capture's error is not the caller's
    throw;
  }
  cuda::check_cuda(cudaStreamEndCapture(stream, &graph.g), "cudaStreamEndCapture (the step's capture)");
  ++captures_;
  // With lookahead the previous launch of exec_ may still run: an update
  // takes effect at the next launch and leaves running launches alone, and a
  // destroyed in-flight exec is freed when it completes (CUDA Programming
  // Guide, "Updating Instantiated Graphs"; cudaGraphExecDestroy).
  if (exec_) {
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(exec_, graph.g, &info) == cudaSuccess) return;
    cudaGetLastError();  // a refused update (new topology) is expected: instantiate again
    cuda::check_cuda(cudaGraphExecDestroy(exec_), "cudaGraphExecDestroy");
    exec_ = nullptr;
  }
  cuda::check_cuda(cudaGraphInstantiate(&exec_, graph.g, 0), "cudaGraphInstantiate (the step's graph)");
  ++instantiations_;
}

void StepGraph::launch(cudaStream_t stream) {
  if (!exec_) throw InvalidArgument("StepGraph::launch: nothing captured");
  cuda::check_cuda(cudaGraphLaunch(exec_, stream), "cudaGraphLaunch (the step's graph)");
}

}  // namespace activekv::runtime
