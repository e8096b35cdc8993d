// Scatter of small table updates. See patch.h.
#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "activekv/cuda/decode_attention.h"
#include "activekv/cuda/patch.h"

namespace activekv::cuda {
namespace {

__global__ void scatter_patches(const Patch* __restrict__ patches, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const Patch p = patches[i];
  uint32_t* dst = reinterpret_cast<uint32_t*>(p.dst);
  for (uint32_t w = 0; w < p.words; ++w) dst[w] = p.data[w];
}

}  // namespace

Patch make_patch(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || bytes % 4 != 0 || bytes > sizeof(Patch::data) || reinterpret_cast<uintptr_t>(dst) % 4 != 0)
    throw InvalidArgument("make_patch: " + std::to_string(bytes) + " bytes (need a multiple of 4, at most 24, aligned)");
  Patch p;
  p.dst = reinterpret_cast<uint64_t>(dst);
  p.words = uint32_t(bytes / 4);
  std::memcpy(p.data, src, bytes);
  return p;
}

PatchBuffer::PatchBuffer() {
  for (void*& e : done_) {
    cudaEvent_t ev;
    check_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "PatchBuffer: cudaEventCreate");
    e = ev;
  }
}

PatchBuffer::~PatchBuffer() {
  for (int b = 0; b < 2; ++b) {
    if (done_[b]) cudaEventSynchronize(static_cast<cudaEvent_t>(done_[b]));
    if (host_[b]) cudaFreeHost(host_[b]);
    if (done_[b]) cudaEventDestroy(static_cast<cudaEvent_t>(done_[b]));
  }
}

void PatchBuffer::submit(const std::vector<Patch>& patches, cudaStream_t stream) {
  if (patches.empty()) return;
  const int b = next_;
  next_ ^= 1;
  cudaEvent_t done = static_cast<cudaEvent_t>(done_[b]);
  check_cuda(cudaEventSynchronize(done), "PatchBuffer: cudaEventSynchronize");
  if (patches.size() > cap_[b]) {
    if (host_[b]) check_cuda(cudaFreeHost(host_[b]), "PatchBuffer: cudaFreeHost");
    host_[b] = nullptr;
    cap_[b] = 0;
    size_t cap = 256;
    while (cap < patches.size()) cap *= 2;
    void* p = nullptr;
    check_cuda(cudaHostAlloc(&p, cap * sizeof(Patch), cudaHostAllocMapped | cudaHostAllocPortable),
               "PatchBuffer: cudaHostAlloc");
    host_[b] = static_cast<Patch*>(p);
    cap_[b] = cap;
  }
  std::memcpy(host_[b], patches.data(), patches.size() * sizeof(Patch));
  void* dev = nullptr;
  check_cuda(cudaHostGetDevicePointer(&dev, host_[b], 0), "PatchBuffer: cudaHostGetDevicePointer");
  const int n = int(patches.size());
  scatter_patches<<<(n + 127) / 128, 128, 0, stream>>>(static_cast<const Patch*>(dev), n);
  check_cuda(cudaGetLastError(), "scatter_patches launch");
  check_cuda(cudaEventRecord(done, stream), "PatchBuffer: cudaEventRecord");
}

}  // namespace activekv::cuda
