// Internal to the CUDA backend: programmatic dependent launch (launch.h says
// what and why). The device half: pdl::begin() in a kernel -- the wait for
// the kernels before it in the stream, then the signal that the next may
// start -- and the host half, pdl::launch, a <<<>>> with the attribute.
//
// The contract of a kernel launched through pdl::launch: no thread reads
// global memory an earlier kernel of the stream wrote, or writes any global
// memory, before it has passed pdl::begin(), and at least one CTA calls it (CTAs with no
// work may leave earlier: the grid is not complete while any CTA waits, so a
// kernel after it still sees everything before it). Reads of memory no
// kernel writes while the stream runs (weights) may come first.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "activekv/cuda/launch.h"
#include "cuda_check.h"

namespace activekv::cuda::pdl {

/// griddepcontrol.wait (every grid this one depends on has completed and its
/// writes are visible; a no-op when launched without the attribute), then
/// griddepcontrol.launch_dependents (the next kernel's CTAs may be scheduled
/// once every CTA of this grid has signalled or exited).
__device__ __forceinline__ void begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// kernel<<<grid, block, smem, stream>>>(args...), with the programmatic
/// stream serialisation attribute when programmatic_launch() is on. Throws
/// CudaError naming `what` if the launch fails (the error is also taken off
/// cudaGetLastError, as the <<<>>> + check it replaces did).
template <class... Params, class... Args>
void launch(const char* what, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            Args&&... args) {
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = programmatic_launch() ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  if (err != cudaSuccess) (void)cudaGetLastError();
  check_cuda(static_cast<int>(err), what);
}

}  // namespace activekv::cuda::pdl
