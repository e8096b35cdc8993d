// Internal to the CUDA backend and the runtime: working on several GPUs from
// one host thread (the head-sharded engine, tensor parallel). A kernel or
// copy is enqueued on the current device's stream, so each shard's work runs
// inside a DeviceScope of its device.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda_check.h"

namespace activekv::cuda {

/// Makes `device` current for a scope, restoring the caller's on exit.
/// Throws CudaError when it cannot -- unless `throws` is false, for
/// destructors (freeing on a device that is gone fails quietly instead).
class DeviceScope {
 public:
  explicit DeviceScope(int device, bool throws = true) {
    if (!throws) {
      if (cudaGetDevice(&prev_) != cudaSuccess || (device != prev_ && cudaSetDevice(device) != cudaSuccess))
        cudaGetLastError();
      return;
    }
    AKV_CUDA(cudaGetDevice(&prev_));
    if (device != prev_) AKV_CUDA(cudaSetDevice(device));
  }
  ~DeviceScope() { cudaSetDevice(prev_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = 0;
};

/// Lets device `from` reach device `to`'s memory directly (NVLink or PCIe
/// peer access) where the pair can, so that peer copies between them are not
/// staged through host memory by the driver. Already enabled is fine; a pair
/// that cannot is left as it is (its copies stay staged). Restores the
/// caller's current device.
inline void enable_peer_access(int from, int to) {
  if (from == to) return;
  int can = 0;
  if (cudaDeviceCanAccessPeer(&can, from, to) != cudaSuccess || !can) {
    cudaGetLastError();
    return;
  }
  DeviceScope on(from);
  if (cudaDeviceEnablePeerAccess(to, 0) != cudaSuccess) cudaGetLastError();  // cudaErrorPeerAccessAlreadyEnabled
}

/// `rows` rows of `width` bytes from src (device src_dev, rows spitch apart)
/// to dst (device dst_dev, dpitch apart), on `stream`: a 2D copy on one
/// device, a peer copy (over NVLink or PCIe, staged by the driver where the
/// devices have no peer access) between two.
inline void copy_rows(void* dst, int dst_dev, size_t dpitch, const void* src, int src_dev, size_t spitch,
                      size_t width, size_t rows, cudaStream_t stream) {
  if (dst_dev == src_dev) {
    AKV_CUDA(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, stream));
    return;
  }
  cudaMemcpy3DPeerParms p{};
  p.srcPtr = make_cudaPitchedPtr(const_cast<void*>(src), spitch, width, rows);
  p.srcDevice = src_dev;
  p.dstPtr = make_cudaPitchedPtr(dst, dpitch, width, rows);
  p.dstDevice = dst_dev;
  p.extent = make_cudaExtent(width, rows, 1);
  AKV_CUDA(cudaMemcpy3DPeerAsync(&p, stream));
}

}  // namespace activekv::cuda
