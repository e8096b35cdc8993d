// Small updates of device-resident tables
// (work lists, split counts) without a host synchronisation.
//
// The host collects patches -- "write these <= 24 bytes at this device
// address" -- and submit() copies them into pinned, device-mapped memory and
// enqueues one kernel on the stream that scatters them. Ordered on the stream
// like any launch: the kernels queued before see the old values, those after
// the new ones.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

typedef struct CUstream_st* cudaStream_t;

namespace activekv::cuda {

struct Patch {
  uint64_t dst = 0;   ///< device address, 4-byte aligned
  uint32_t words = 0; ///< 32-bit words to write (1..6)
  uint32_t pad = 0;
  uint32_t data[6] = {};
};

/// A patch writing `bytes` (a multiple of 4, at most 24) from `src` to `dst`.
/// Throws InvalidArgument otherwise.
Patch make_patch(void* dst, const void* src, size_t bytes);

class PatchBuffer {
 public:
  PatchBuffer();
  ~PatchBuffer();
  PatchBuffer(const PatchBuffer&) = delete;
  PatchBuffer& operator=(const PatchBuffer&) = delete;

  /// Enqueues the scatter of `patches` on `stream` (nothing if empty). Two
  /// pinned buffers alternate; before one is refilled, the scatter that last
  /// read it is waited for (it ran an update ago, so this does not stall).
  /// Throws CudaError.
  void submit(const std::vector<Patch>& patches, cudaStream_t stream);

 private:
  Patch* host_[2] = {nullptr, nullptr};
  size_t cap_[2] = {0, 0};
  void* done_[2] = {nullptr, nullptr};  // cudaEvent_t
  int next_ = 0;
};

}  // namespace activekv::cuda
