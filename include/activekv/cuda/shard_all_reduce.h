// The sum over tensor-parallel shards of a layer's partial products (issue 15
// part 3, docs/tensor-parallel.md): after sum(), every shard's buffer holds
// the elementwise sum of all shards' buffers.
//
// Two ways, chosen at construction:
//   NCCL     the devices are distinct and the build has NCCL (ACTIVEKV_NCCL):
//            one communicator per shard (ncclCommInitAll), and each sum is
//            one ncclAllReduce per shard in a group, on the shard's stream.
//            NVLink multicast stays off: NCCL_NVLS_ENABLE is set to 0 in the
//            environment before the communicators exist (KINDS.md of the
//            GPU machines says why), and nothing here calls cuMulticastCreate.
//   local    a device appears twice (`--gpus 0,0`: two shards on one GPU, for
//            tests on one GPU -- NCCL takes one rank per device), or no NCCL:
//            the first shard's stream waits for the others, gathers their
//            buffers (peer copies from other devices), sums them in shard
//            order -- ((b0 + b1) + b2) + ... -- into every buffer.
// For two shards both give the same bits (one fp32 addition, commutative);
// for more, NCCL's ring may add in another order (equal within fp32 rounding).
//
// Not thread-safe; one instance per set of shards. Selects each shard's
// device while it works and restores the caller's current device.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

typedef struct CUstream_st* cudaStream_t;

namespace activekv::cuda {

class ShardAllReduce {
 public:
  /// devices[i]: shard i's device (1 or more; repeats allowed). max_floats:
  /// the longest sum (the local way's gather buffer on the first device).
  /// Throws InvalidArgument for no device or max_floats == 0, CudaError
  /// (naming NCCL's error) when the communicators or buffers cannot be made
  /// or the first sum fails: with NCCL, one sum of one float runs here, so
  /// that NCCL connects the GPUs and allocates its buffers (their size not
  /// yet measured) at construction, not in the first step.
  ShardAllReduce(const std::vector<int>& devices, size_t max_floats);
  ~ShardAllReduce();
  ShardAllReduce(const ShardAllReduce&) = delete;
  ShardAllReduce& operator=(const ShardAllReduce&) = delete;

  /// bufs[i]: shard i's device fp32 [n] on devices[i]; streams[i]: a stream
  /// of that device, which the sum is ordered after and which later work
  /// on it waits for. Enqueued, no host synchronisation. Throws
  /// InvalidArgument for spans of the wrong size or n > max_floats, and
  /// CudaError for an NCCL error (this call's, or one a rank reported since
  /// the last): the communicators are then aborted, which ends their
  /// kernels, and every later sum throws.
  void sum(std::span<float* const> bufs, size_t n, std::span<const cudaStream_t> streams);

  /// True when the sums go through NCCL.
  bool uses_nccl() const;
  int n_shards() const { return int(devices_.size()); }

 private:
  struct Nccl;
  void release();
  void warm_up();  // NCCL: one sum of one float, so NCCL connects at construction
  void local_sum(std::span<float* const> bufs, size_t n, std::span<const cudaStream_t> streams);

  std::vector<int> devices_;
  size_t max_floats_ = 0;
  std::unique_ptr<Nccl> nccl_;
  float* gather_ = nullptr;           // local: [n_shards][max_floats] on devices_[0]
  std::vector<void*> ready_, done_;   // local: cudaEvent_t per shard (on its device)
};

/// Whether this build can use NCCL (found at configure time).
bool nccl_built();

}  // namespace activekv::cuda
