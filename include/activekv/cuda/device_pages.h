// Device memory for the pages a placement keeps on the GPU (SPEC §8: a page
// resident in HBM costs HBM time, not link time).
//
// One cudaMalloc'ed slab of `n_slots` fixed slots of `slot_bytes` each (a
// bf16 page, or an encoded page, which is never larger than its bf16 page
// plus the codec's header and directory: the caller sizes slots for the
// largest kind it keeps). Slots are handed out and taken back with a free
// list; the slab never moves, so a slot's address stays valid until release.
// Not thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <unordered_map>
#include <vector>

#include "activekv/cuda/decode_engine.h"

namespace activekv::cuda {

/// Bytes of device memory free now (cudaMemGetInfo), and in total.
struct GpuMemory {
  size_t free = 0, total = 0;
};
GpuMemory gpu_memory();

class DevicePagePool {
 public:
  /// Throws InvalidArgument for zero sizes and CudaError naming the bytes
  /// asked and the bytes free when the slab cannot be had. `what` names the
  /// pool in messages ("the resident history").
  DevicePagePool(size_t slot_bytes, size_t n_slots, const std::string& what);
  ~DevicePagePool();
  DevicePagePool(const DevicePagePool&) = delete;
  DevicePagePool& operator=(const DevicePagePool&) = delete;

  /// A free slot (16-byte aligned). Throws Error naming the pool when all are in use.
  std::byte* acquire();
  /// Returns a slot. Throws InvalidArgument for an address that is not a slot in use.
  void release(const void* slot);

  size_t slot_bytes() const { return slot_bytes_; }
  size_t n_slots() const { return n_slots_; }
  size_t free_slots() const { return free_.size(); }

 private:
  std::byte* base_ = nullptr;
  size_t slot_bytes_, n_slots_;
  std::string what_;
  std::vector<size_t> free_;   // slot indexes, popped from the back (lowest first)
  std::vector<bool> in_use_;
};

/// Device copies of the pages of a batch, for running the decode engine with
/// every page resident (benchmarks and tests; the runtime places pages itself).
/// Each distinct host page is copied once, when first seen.
class ResidentPages {
 public:
  /// Room for `max_pages` pages of at most `slot_bytes` bytes. Throws as DevicePagePool.
  ResidentPages(size_t slot_bytes, size_t max_pages);
  /// The same tables with every page's `device` set to its copy (synchronous
  /// upload of pages not yet copied). Throws Error when the pool is full or a
  /// page is larger than a slot.
  std::vector<SeqPages> place(const std::vector<SeqPages>& seqs);

 private:
  DevicePagePool pool_;
  std::unordered_map<const std::byte*, std::byte*> copies_;  // host page -> device copy
};

}  // namespace activekv::cuda
