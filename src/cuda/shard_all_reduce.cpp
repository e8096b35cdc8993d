// The sum over tensor-parallel shards. See include/activekv/cuda/shard_all_reduce.h.
#include "activekv/cuda/shard_all_reduce.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <array>
#include <cstdlib>
#include <cstring>

#include "activekv/core/error.h"
#include "cuda_check.h"
#include "device_buffer.h"
#include "device_scope.h"
#include "shard_sum.h"

#if ACTIVEKV_HAVE_NCCL
#include <nccl.h>
#endif

namespace activekv::cuda {
namespace {

bool devices_distinct(const std::vector<int>& d) {
  for (size_t i = 0; i < d.size(); ++i)
    for (size_t j = i + 1; j < d.size(); ++j)
      if (d[i] == d[j]) return false;
  return true;
}

}  // namespace

bool nccl_built() { return ACTIVEKV_HAVE_NCCL != 0; }

#if ACTIVEKV_HAVE_NCCL
struct ShardAllReduce::Nccl {
  std::vector<ncclComm_t> comms;  // empty once aborted
  ~Nccl() {
    for (ncclComm_t c : comms)
      if (c) ncclCommDestroy(c);
  }
  // After an error a rank's kernel may wait forever for its peers: abort
  // every communicator (which ends their kernels) so that the streams can
  // drain and later sums throw instead of hanging.
  void abort() noexcept {
    for (ncclComm_t c : comms)
      if (c) ncclCommAbort(c);
    comms.clear();
  }
};

namespace {
void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) {
    const char* last = ncclGetLastError(nullptr);
    throw CudaError(fmt::format("NCCL {}: {}{}{}", what, ncclGetErrorString(r), last && *last ? ": " : "",
                                last ? last : ""));
  }
}

// One all-reduce per rank of `n` floats in place, as one group; the group is
// ended whatever happens inside it. The first error, else ncclSuccess.
ncclResult_t group_all_reduce(const std::vector<ncclComm_t>& comms, std::span<float* const> bufs, size_t n,
                              std::span<const cudaStream_t> streams) {
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return r;
  for (size_t i = 0; i < comms.size() && r == ncclSuccess; ++i)
    r = ncclAllReduce(bufs[i], bufs[i], n, ncclFloat, ncclSum, comms[i], streams[i]);
  const ncclResult_t end = ncclGroupEnd();
  return r != ncclSuccess ? r : end;
}
}  // namespace
#else
struct ShardAllReduce::Nccl {};
#endif

ShardAllReduce::ShardAllReduce(const std::vector<int>& devices, size_t max_floats)
    : devices_(devices), max_floats_(max_floats) {
  if (devices.empty()) throw InvalidArgument("all-reduce: no device");
  if (max_floats == 0) throw InvalidArgument("all-reduce: max_floats is 0");
  if (devices.size() > size_t(kMaxSumShards))
    throw InvalidArgument(fmt::format("all-reduce: {} shards, at most {}", devices.size(), kMaxSumShards));
#if ACTIVEKV_HAVE_NCCL
  if (devices.size() > 1 && devices_distinct(devices)) {
    // Multicast (NVLS) off whatever the caller's environment says: it can
    // take a shared host's GPUs out of service (the GPU machines' KINDS.md).
    // setenv only when needed: it races with getenv in other threads.
    const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
    if (nvls == nullptr || std::strcmp(nvls, "0") != 0) setenv("NCCL_NVLS_ENABLE", "0", 1);
    nccl_ = std::make_unique<Nccl>();
    nccl_->comms.resize(devices.size());
    check_nccl(ncclCommInitAll(nccl_->comms.data(), int(devices.size()), devices.data()), "ncclCommInitAll");
    warm_up();
    return;
  }
#endif
  if (devices.size() == 1) return;  // a sum of one buffer is itself
  try {
    {
      DeviceScope on(devices_[0]);
      gather_ = device_alloc<float>(devices.size() * max_floats, "all-reduce: gather buffer");
    }
    for (int d : devices_) {
      DeviceScope on(d);
      cudaEvent_t r = nullptr, e = nullptr;
      AKV_CUDA(cudaEventCreateWithFlags(&r, cudaEventDisableTiming));
      ready_.push_back(r);
      AKV_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      done_.push_back(e);
    }
  } catch (...) {
    release();  // the members' destructors would not free the events
    throw;
  }
}

// NCCL (2.22 and later) connects the ranks and allocates its buffers (their
// size depends on the version and topology; not yet measured here) at the
// first collective. One sum of one float now, at model load, puts that
// before the history is sized from the free memory, and out of the first
// step's time.
void ShardAllReduce::warm_up() {
#if ACTIVEKV_HAVE_NCCL
  std::vector<float*> one(devices_.size(), nullptr);
  std::vector<cudaStream_t> streams(devices_.size(), nullptr);  // each device's default stream
  ncclResult_t r = ncclSuccess;
  try {
    for (size_t i = 0; i < devices_.size(); ++i) {
      DeviceScope on(devices_[i]);
      one[i] = device_alloc<float>(1, "all-reduce: warm-up value");
      AKV_CUDA(cudaMemset(one[i], 0, sizeof(float)));
    }
    r = group_all_reduce(nccl_->comms, one, 1, streams);
    if (r != ncclSuccess) nccl_->abort();
    for (size_t i = 0; i < devices_.size(); ++i) {
      DeviceScope on(devices_[i]);
      AKV_CUDA(cudaStreamSynchronize(nullptr));
    }
  } catch (...) {
    for (size_t i = 0; i < devices_.size(); ++i) {
      DeviceScope on(devices_[i], false);
      cudaFree(one[i]);
    }
    throw;
  }
  for (size_t i = 0; i < devices_.size(); ++i) {
    DeviceScope on(devices_[i], false);
    cudaFree(one[i]);
  }
  check_nccl(r, "first all-reduce (connecting the GPUs)");
#endif
}

ShardAllReduce::~ShardAllReduce() { release(); }

void ShardAllReduce::release() {
  for (void* e : ready_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  for (void* e : done_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  ready_.clear();
  done_.clear();
  if (gather_) cudaFree(gather_);
  gather_ = nullptr;
  nccl_.reset();
}

bool ShardAllReduce::uses_nccl() const { return nccl_ != nullptr; }

void ShardAllReduce::sum(std::span<float* const> bufs, size_t n, std::span<const cudaStream_t> streams) {
  if (bufs.size() != devices_.size() || streams.size() != devices_.size())
    throw InvalidArgument(fmt::format("all-reduce: {} buffers and {} streams for {} shards", bufs.size(),
                                      streams.size(), devices_.size()));
  if (n > max_floats_) throw InvalidArgument(fmt::format("all-reduce: {} values, at most {}", n, max_floats_));
  if (n == 0 || devices_.size() == 1) return;
#if ACTIVEKV_HAVE_NCCL
  if (nccl_) {
    if (nccl_->comms.empty()) throw CudaError("all-reduce: the NCCL communicators were aborted after an earlier error");
    for (ncclComm_t c : nccl_->comms) {  // an error a rank reported since the last sum (host query, no wait)
      ncclResult_t async = ncclSuccess;
      const ncclResult_t q = ncclCommGetAsyncError(c, &async);
      if (q != ncclSuccess || async != ncclSuccess) {
        nccl_->abort();
        check_nccl(q != ncclSuccess ? q : async, "asynchronous error");
      }
    }
    const ncclResult_t r = group_all_reduce(nccl_->comms, bufs, n, streams);
    if (r != ncclSuccess) {
      nccl_->abort();
      check_nccl(r, "ncclAllReduce");
    }
    return;
  }
#endif
  local_sum(bufs, n, streams);
}

// On the first shard's stream: wait for every shard, gather, sum in shard
// order into the first buffer, copy it to the others; each shard's stream
// then waits for that.
void ShardAllReduce::local_sum(std::span<float* const> bufs, size_t n, std::span<const cudaStream_t> streams) {
  const size_t shards = devices_.size();
  const int home = devices_[0];
  for (size_t i = 1; i < shards; ++i) {
    DeviceScope on(devices_[i]);
    AKV_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(ready_[i]), streams[i]));
  }
  DeviceScope on(home);
  const cudaStream_t s = streams[0];
  std::array<const float*, kMaxSumShards> src{};
  for (size_t i = 0; i < shards; ++i) {
    if (i > 0) AKV_CUDA(cudaStreamWaitEvent(s, static_cast<cudaEvent_t>(ready_[i]), 0));
    src[i] = bufs[i];
    if (devices_[i] != home) {
      float* slot = gather_ + i * max_floats_;
      copy_rows(slot, home, n * sizeof(float), bufs[i], devices_[i], n * sizeof(float), n * sizeof(float), 1, s);
      src[i] = slot;
    }
  }
  launch_sum_shards(bufs[0], src.data(), int(shards), n, s);
  for (size_t i = 1; i < shards; ++i)
    copy_rows(bufs[i], devices_[i], n * sizeof(float), bufs[0], home, n * sizeof(float), n * sizeof(float), 1, s);
  AKV_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(done_[0]), s));
  for (size_t i = 1; i < shards; ++i) {
    DeviceScope shard(devices_[i]);
    AKV_CUDA(cudaStreamWaitEvent(streams[i], static_cast<cudaEvent_t>(done_[0]), 0));
  }
}

}  // namespace activekv::cuda
