#include "activekv/cuda/device_pages.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "activekv/cuda/decode_attention.h"

namespace activekv::cuda {

GpuMemory gpu_memory() {
  GpuMemory m;
  check_cuda(cudaMemGetInfo(&m.free, &m.total), "cudaMemGetInfo");
  return m;
}

DevicePagePool::DevicePagePool(size_t slot_bytes, size_t n_slots, const std::string& what)
    : slot_bytes_((slot_bytes + 255) / 256 * 256), n_slots_(n_slots), what_(what) {
  if (slot_bytes == 0 || n_slots == 0) throw InvalidArgument("DevicePagePool: " + what + ": zero slots or slot size");
  const size_t bytes = slot_bytes_ * n_slots_;
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    throw CudaError(fmt::format("{} does not fit the GPU: {} pages of {:.2f} MiB = {:.2f} GiB asked, {:.2f} GiB free ({})",
                                what, n_slots_, double(slot_bytes_) / (1 << 20), double(bytes) / (1ull << 30),
                                double(free) / (1ull << 30), cudaGetErrorString(e)));
  }
  base_ = static_cast<std::byte*>(p);
  in_use_.assign(n_slots_, false);
  for (size_t i = n_slots_; i-- > 0;) free_.push_back(i);
}

DevicePagePool::~DevicePagePool() {
  if (base_) cudaFree(base_);
}

std::byte* DevicePagePool::acquire() {
  if (free_.empty())
    throw Error(fmt::format("{}: all {} GPU page slots are in use", what_, n_slots_));
  const size_t i = free_.back();
  free_.pop_back();
  in_use_[i] = true;
  return base_ + i * slot_bytes_;
}

void DevicePagePool::release(const void* slot) {
  const auto* p = static_cast<const std::byte*>(slot);
  const size_t off = size_t(p - base_);
  if (p < base_ || off % slot_bytes_ != 0 || off / slot_bytes_ >= n_slots_ || !in_use_[off / slot_bytes_])
    throw InvalidArgument("DevicePagePool::release: " + what_ + ": not a slot in use");
  in_use_[off / slot_bytes_] = false;
  free_.push_back(off / slot_bytes_);
}

ResidentPages::ResidentPages(size_t slot_bytes, size_t max_pages)
    : pool_(slot_bytes, max_pages, "resident pages") {}

std::vector<SeqPages> ResidentPages::place(const std::vector<SeqPages>& seqs) {
  std::vector<SeqPages> out = seqs;
  for (SeqPages& s : out)
    for (auto& table : s.tables)
      for (PageRef& r : table) {
        if (!r.host) continue;
        auto it = copies_.find(r.host);
        if (it == copies_.end()) {
          if (r.bytes > pool_.slot_bytes())
            throw Error(fmt::format("ResidentPages: a page of {} bytes exceeds the {}-byte slots", r.bytes,
                                    pool_.slot_bytes()));
          std::byte* d = pool_.acquire();
          check_cuda(cudaMemcpy(d, r.host, r.bytes, cudaMemcpyHostToDevice), "ResidentPages: upload");
          it = copies_.emplace(r.host, d).first;
        }
        r.device = it->second;
      }
  return out;
}

}  // namespace activekv::cuda
