// The forward pass tensor parallel over several GPUs. See
// include/activekv/runtime/tensor_parallel.h.
#include "activekv/runtime/tensor_parallel.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>

#include "activekv/runtime/gpu_weights.h"
#include "device_buffer.h"
#include "device_scope.h"

namespace activekv::runtime {
namespace {
using cuda::DeviceScope;
}  // namespace

struct TensorParallelForward::Shard {
  int device = 0;
  model::ModelConfig config;  // model::shard_config: the forward's dims
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;  // after this shard's last enqueued work (the joins)
  std::unique_ptr<GpuWeights> weights;
  std::unique_ptr<GpuForward> forward;
  int32_t* ids = nullptr;  // this device's copies of the rows' ids and positions (null on the home device)
  int64_t* pos = nullptr;

  ~Shard() {
    DeviceScope on(device, false);
    forward.reset();
    weights.reset();
    cudaFree(ids);
    cudaFree(pos);
    if (ready) cudaEventDestroy(ready);
    if (stream) cudaStreamDestroy(stream);
  }
};

TensorParallelForward::TensorParallelForward(const gguf::File& f, const model::ModelConfig& c,
                                             const std::vector<int>& devices, int max_rows, bool f32_activations)
    : c_(c), tensors_(model::ModelTensors::find(f, c_)), plan_(model::plan_tensor_split(c_, tensors_, int(devices.size()))),
      max_rows_(max_rows) {
  if (max_rows <= 0) throw InvalidArgument("TensorParallelForward: max_rows must be positive");
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    count = 0;
  }
  for (int d : devices)
    if (d < 0 || d >= count)
      throw InvalidArgument(fmt::format("tensor parallel: GPU {} does not exist ({} GPU{} here)", d, count,
                                        count == 1 ? "" : "s"));
  for (size_t i = 0; i < devices.size(); ++i) {
    auto s = std::make_unique<Shard>();
    s->device = devices[i];
    s->config = model::shard_config(c_, plan_.shards[i]);
    DeviceScope on(s->device);
    cuda::check_cuda(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking), "tensor parallel: stream");
    cuda::check_cuda(cudaEventCreateWithFlags(&s->ready, cudaEventDisableTiming), "tensor parallel: event");
    shards_.push_back(std::move(s));  // from here its destructor frees what it holds
    Shard& sh = *shards_.back();
    try {
      sh.weights = std::make_unique<GpuWeights>(f, c_, &plan_, int(i));
    } catch (const cuda::CudaError&) {
      throw;
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(fmt::format("tensor parallel shard {} (GPU {}): {}", i, sh.device, e.what()));
    } catch (const Error& e) {  // the sizes that do not fit, named with the shard's GPU
      throw Error(fmt::format("tensor parallel shard {} (GPU {}): {}", i, sh.device, e.what()));
    }
    sh.forward = std::make_unique<GpuForward>(sh.config, *sh.weights, max_rows, f32_activations);
    if (i > 0 && sh.device != devices[0]) {
      sh.ids = cuda::device_alloc<int32_t>(size_t(max_rows), "tensor parallel: token ids");
      sh.pos = cuda::device_alloc<int64_t>(size_t(max_rows), "tensor parallel: positions");
    }
  }
  // Direct peer access both ways between distinct GPUs: the logits slices,
  // token ids and positions (and the local sums without NCCL) are peer copies,
  // which the driver otherwise stages through host memory.
  for (int a : devices)
    for (int b : devices) cuda::enable_peer_access(a, b);
  reduce_ = std::make_unique<cuda::ShardAllReduce>(devices, size_t(max_rows) * size_t(c_.d_model));
  for (const auto& s : shards_) {  // what every all-reduce sums, gathered once (two per layer and step)
    partials_.push_back(s->forward->partial());
    streams_.push_back(s->stream);
  }
  DeviceScope home(devices[0]);
  logits_ = cuda::device_alloc<float>(size_t(max_rows) * size_t(c_.vocab_size), "tensor parallel: logits");
}

TensorParallelForward::~TensorParallelForward() {
  for (auto& s : shards_) {
    DeviceScope on(s->device, false);
    cudaStreamSynchronize(s->stream);
  }
  reduce_.reset();
  if (!shards_.empty()) {
    DeviceScope home(shards_[0]->device, false);
    cudaFree(logits_);
  }
  shards_.clear();
}

// After a failure part way through run(): the home stream waits for every
// shard's work enqueued so far, so that the caller's next writes on it (ids,
// positions) cannot race a shard still reading them.
void TensorParallelForward::join_after_error() noexcept {
  const int home = shards_[0]->device;
  for (size_t i = 1; i < shards_.size(); ++i) {
    DeviceScope on(shards_[i]->device, false);
    if (cudaEventRecord(shards_[i]->ready, shards_[i]->stream) != cudaSuccess) continue;
    DeviceScope back(home, false);
    cudaStreamWaitEvent(shards_[0]->stream, shards_[i]->ready, 0);
  }
  cudaGetLastError();
}

cudaStream_t TensorParallelForward::stream(int shard) const { return shards_.at(size_t(shard))->stream; }
int TensorParallelForward::device(int shard) const { return shards_.at(size_t(shard))->device; }
const model::ModelConfig& TensorParallelForward::shard_config(int shard) const { return shards_.at(size_t(shard))->config; }
size_t TensorParallelForward::weight_bytes(int shard) const { return shards_.at(size_t(shard))->weights->bytes(); }
bool TensorParallelForward::uses_nccl() const { return reduce_->uses_nccl(); }

// Runs phase(i, shard) for every shard on its device.
template <class Phase>
void TensorParallelForward::each(Phase phase) {
  for (size_t i = 0; i < shards_.size(); ++i) {
    DeviceScope on(shards_[i]->device);
    phase(int(i), *shards_[i]);
  }
}

void TensorParallelForward::all_reduce(int T) {
  reduce_->sum(partials_, size_t(T) * size_t(c_.d_model), streams_);
}

// Each shard's vocabulary rows into the home buffer's columns [vocab0, +
// vocab_rows); the home stream then waits for every shard.
void TensorParallelForward::gather_logits(int T, bool all_logits, int logits_row) {
  const int rows = all_logits ? T : 1;
  const size_t vocab = size_t(c_.vocab_size);
  const int home = shards_[0]->device;
  each([&](int i, Shard& s) {
    const model::ShardSplit& part = plan_.shards[size_t(i)];
    const size_t width = size_t(part.vocab_rows) * sizeof(float);
    cuda::copy_rows(logits_ + size_t(logits_row) * vocab + size_t(part.vocab0), home, vocab * sizeof(float),
                    s.forward->logits() + size_t(logits_row) * size_t(part.vocab_rows), s.device, width, width,
                    size_t(rows), s.stream);
    cuda::check_cuda(cudaEventRecord(s.ready, s.stream), "tensor parallel: event");
  });
  DeviceScope on(home);
  for (size_t i = 1; i < shards_.size(); ++i)
    cuda::check_cuda(cudaStreamWaitEvent(shards_[0]->stream, shards_[i]->ready, 0), "tensor parallel: wait");
}

void TensorParallelForward::run(const int32_t* ids, const int64_t* pos, int T, const ShardAttention& attend,
                                bool all_logits, int logits_row) {
  shards_[0]->forward->check_run(T, all_logits, logits_row);
  try {
    run_shards(ids, pos, T, attend, all_logits, logits_row);
  } catch (...) {
    join_after_error();
    throw;
  }
}

void TensorParallelForward::run_shards(const int32_t* ids, const int64_t* pos, int T, const ShardAttention& attend,
                                       bool all_logits, int logits_row) {
  Shard& home = *shards_[0];
  {  // every shard's stream after the home stream's work so far (the ids and positions)
    DeviceScope on(home.device);
    cuda::check_cuda(cudaEventRecord(home.ready, home.stream), "tensor parallel: event");
  }
  each([&](int i, Shard& s) {
    if (i == 0) return;
    cuda::check_cuda(cudaStreamWaitEvent(s.stream, home.ready, 0), "tensor parallel: wait");
    if (!s.ids) return;
    cuda::copy_rows(s.ids, s.device, sizeof(int32_t) * size_t(T), ids, home.device, sizeof(int32_t) * size_t(T),
                    sizeof(int32_t) * size_t(T), 1, s.stream);
    cuda::copy_rows(s.pos, s.device, sizeof(int64_t) * size_t(T), pos, home.device, sizeof(int64_t) * size_t(T),
                    sizeof(int64_t) * size_t(T), 1, s.stream);
  });
  const auto ids_of = [&](const Shard& s) { return s.ids ? s.ids : ids; };
  const auto pos_of = [&](const Shard& s) { return s.pos ? s.pos : pos; };
  each([&](int, Shard& s) { s.forward->embed(ids_of(s), T, s.stream); });
  for (int l = 0; l < c_.n_layers; ++l) {
    each([&](int i, Shard& s) {
      const LayerAttention mine = [&](int layer, int rows, const float* q, const float* k, const float* v, float* out,
                                      cuda::Int8Blocks out_int8) {
        return attend(i, layer, rows, q, k, v, out, out_int8);
      };
      s.forward->attention_partial(l, T, pos_of(s), mine, s.stream);
    });
    all_reduce(T);
    each([&](int, Shard& s) {
      s.forward->add_partial(l, false, T, s.stream);
      s.forward->ffn_partial(l, T, s.stream);
    });
    all_reduce(T);
    each([&](int, Shard& s) { s.forward->add_partial(l, true, T, s.stream); });
  }
  each([&](int, Shard& s) { s.forward->head(T, all_logits, s.stream, logits_row); });
  gather_logits(T, all_logits, logits_row);
}

}  // namespace activekv::runtime
