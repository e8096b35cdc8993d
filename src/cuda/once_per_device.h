// Internal to the CUDA backend: work to do once per CUDA device in a process,
// safe to call from several threads. Kernel attributes such as the dynamic
// shared memory limit (cudaFuncSetAttribute) belong to the device that is
// current when they are set: a flag per process would leave a second GPU
// unconfigured, and its launches would fail.
#pragma once

#include <cuda_runtime.h>

#include <atomic>

#include "activekv/cuda/decode_attention.h"

namespace activekv::cuda {

class OncePerDevice {
 public:
  /// Runs fn() unless a call of it has returned on the current device
  /// (cudaGetDevice). Threads that arrive together the first time may each
  /// run it, so fn must be idempotent (cudaFuncSetAttribute is); an fn that
  /// throws counts as not run. Devices past kMaxDevices run fn() every time.
  template <class Fn>
  void operator()(Fn&& fn) {
    int dev = 0;
    check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
    if (dev < 0 || dev >= kMaxDevices) {
      fn();
      return;
    }
    if (done_[dev].load(std::memory_order_acquire)) return;
    fn();
    done_[dev].store(true, std::memory_order_release);
  }

 private:
  static constexpr int kMaxDevices = 64;
  std::atomic<bool> done_[kMaxDevices]{};
};

}  // namespace activekv::cuda
