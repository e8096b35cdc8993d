// The shared half of the GPU runtime. See activekv/runtime/gpu_model.h.
#include "activekv/runtime/gpu_model.h"

#include <fmt/format.h>

#include <algorithm>

#include "activekv/cuda/decode_attention.h"
#include "activekv/cuda/device_pages.h"
#include "activekv/route/placement.h"
#include "device_buffer.h"
#include "model_state.h"

namespace activekv::runtime {
namespace {

// "12.0 MiB" below a GiB, "3.25 GiB" above: the budget error's sizes, small in tests, large on the H200.
std::string size_text(size_t bytes) {
  const double b = double(bytes);
  if (bytes < (size_t(1) << 30)) return fmt::format("{:.1f} MiB", b / double(1 << 20));
  return fmt::format("{:.2f} GiB", b / double(1ull << 30));
}

}  // namespace

GpuModel::Impl::Impl(const gguf::File& f, const model::ModelConfig& cfg, const ModelOptions& o) : c(cfg), opt(o) {
  if (c.n_global_layers() == 0)
    throw Error(fmt::format("the GPU runtime needs a layer that attends the whole history; this model's are {}",
                            c.layer_split()));
  if (opt.max_rows <= 0) throw InvalidArgument("GpuModel: max_rows must be positive");
  cuda::require_gpu(opt.device, "--device cuda");
  cudaDeviceProp prop{};
  cuda::check_cuda(cudaGetDeviceProperties(&prop, opt.device), "cudaGetDeviceProperties");
  device = prop.name;
  cuda::check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  weights = std::make_unique<GpuWeights>(f, c);  // checks types and free memory first
  forward = make_forward(opt.max_rows);
  const size_t R = size_t(GpuForward::kMatvecRows);
  batch_ids = cuda::device_alloc<int32_t>(R, "GpuModel: the batch's token ids");
  batch_pos = cuda::device_alloc<int64_t>(R, "GpuModel: the batch's positions");
  void* h = nullptr;
  cuda::check_cuda(cudaHostAlloc(&h, R * sizeof(int64_t), cudaHostAllocPortable), "cudaHostAlloc (the batch's positions)");
  host_pos = static_cast<int64_t*>(h);
  const cuda::GpuMemory mem = cuda::gpu_memory();
  kv_budget = opt.gpu_kv_mem > 0 ? opt.gpu_kv_mem : route::default_gpu_kv_budget(mem.free, mem.total);
}

GpuModel::Impl::~Impl() {
  if (stream) cudaStreamSynchronize(stream);
  batch_engine.reset();  // before the stream it enqueues on
  forward.reset();
  cudaFree(batch_ids);
  cudaFree(batch_pos);
  if (host_pos) cudaFreeHost(host_pos);
  if (stream) cudaStreamDestroy(stream);
}

bool GpuModel::Impl::fit_rows(int rows, int fallback) {
  if (!forward) throw Error(broken);
  if (forward->max_rows() >= rows) return true;
  cuda::check_cuda(cudaStreamSynchronize(stream), "before growing the forward's buffers");
  forward.reset();
  try {
    forward = make_forward(rows);
    return true;
  } catch (const cuda::CudaError&) {
  }
  const int back = std::max(fallback, opt.max_rows);
  try {
    forward = make_forward(back);
  } catch (const std::exception& e) {
    broken = fmt::format("the model's forward buffers ({} rows) could not be allocated again after a larger size "
                         "failed: {}", back, e.what());
    throw Error(broken);
  }
  return false;
}

size_t GpuModel::Impl::budget_cap(size_t asked) const {
  const size_t left = kv_budget - std::min(kv_budget, kv_reserved);
  if (asked > left)
    throw Error(fmt::format("the sequence's GPU KV budget does not fit: asked {}, {} free of the model's {} "
                            "({} open sequences hold {})",
                            size_text(asked), size_text(left), size_text(kv_budget), open, size_text(kv_reserved)));
  return left;
}

GpuModel::GpuModel(const gguf::File& f, const model::ModelConfig& c, const ModelOptions& opt)
    : impl_(std::make_unique<Impl>(f, c, opt)) {}

GpuModel::~GpuModel() = default;

const model::ModelConfig& GpuModel::config() const { return impl_->c; }
const std::string& GpuModel::device_name() const { return impl_->device; }
size_t GpuModel::weight_bytes() const { return impl_->weights->bytes(); }
size_t GpuModel::kv_budget() const { return impl_->kv_budget; }
size_t GpuModel::kv_reserved() const { return impl_->kv_reserved; }
int GpuModel::open_sequences() const { return impl_->open; }
const std::string& GpuModel::broken() const { return impl_->broken; }

}  // namespace activekv::runtime
