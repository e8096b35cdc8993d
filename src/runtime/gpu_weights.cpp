#include "activekv/runtime/gpu_weights.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "activekv/cuda/device_pages.h"
#include "device_buffer.h"
#include "activekv/gguf/tensor_type.h"
#include "activekv/model/tensors.h"

namespace activekv::runtime {
namespace {

constexpr size_t kAlign = 256;
size_t aligned(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

bool is_vector(const gguf::TensorInfo* t) { return t && t->dims.size() == 1; }

// Device bytes of one tensor: as stored for a matrix, fp32 for a vector.
size_t device_bytes(const gguf::TensorInfo* t) {
  if (!t) return 0;
  return aligned(is_vector(t) ? t->n_elements * sizeof(float) : t->n_bytes);
}

template <class F>
void for_each_tensor(const model::ModelTensors& m, F&& f) {
  f(m.token_embd);
  f(m.output_norm);
  if (m.output != m.token_embd) f(m.output);
  for (const model::LayerTensors& L : m.layers)
    for (const gguf::TensorInfo* t :
         {L.attn_norm, L.wq, L.wk, L.wv, L.bq, L.bk, L.bv, L.wo, L.ffn_norm, L.w_gate, L.w_up, L.w_down, L.q_norm,
          L.k_norm, L.post_attn_norm, L.post_ffn_norm})
      if (t) f(t);
}

bool stored_split(const gguf::TensorInfo* t, bool split) {
  return split && !is_vector(t) && cuda::has_split_layout(t->type);
}

}  // namespace

size_t GpuWeights::bytes_needed(const gguf::File& f, const model::ModelConfig& c) {
  size_t n = 0;
  for_each_tensor(model::ModelTensors::find(f, c), [&](const gguf::TensorInfo* t) { n += device_bytes(t); });
  return n;
}

GpuWeights::GpuWeights(const gguf::File& f, const model::ModelConfig& c) {
  const model::ModelTensors m = model::ModelTensors::find(f, c);
  for_each_tensor(m, [&](const gguf::TensorInfo* t) {
    if (!is_vector(t)) cuda::require_gpu_kernel(t->name, t->type);
    else if (!gguf::is_supported(t->type))
      throw Error(fmt::format("tensor '{}' has type {}, which ActiveKV cannot read", t->name, gguf::type_name(t->type)));
    bytes_ += device_bytes(t);
  });
  // Split matrices are uploaded into a scratch buffer and repacked from
  // there: the largest of them is needed beside the weights while loading.
  const bool split = cuda::split_layout_wanted();
  size_t scratch_bytes = 0;
  for_each_tensor(m, [&](const gguf::TensorInfo* t) {
    if (stored_split(t, split)) scratch_bytes = std::max(scratch_bytes, size_t(t->n_bytes));
  });
  const cuda::GpuMemory mem = cuda::gpu_memory();
  if (bytes_ + scratch_bytes > mem.free) {
    throw Error(fmt::format("the model's weights need {:.2f} GiB on the GPU (and {:.2f} GiB more while loading), "
                            "{:.2f} GiB are free",
                            double(bytes_) / (1ull << 30), double(scratch_bytes) / (1ull << 30),
                            double(mem.free) / (1ull << 30)));
  }
  std::unique_ptr<cuda::DevBuf> scratch;
  if (scratch_bytes > 0) scratch = std::make_unique<cuda::DevBuf>(scratch_bytes, "GpuWeights: repack scratch");
  const cudaError_t e = cudaMalloc(&base_, bytes_);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw Error(fmt::format("the model's weights need {:.2f} GiB on the GPU: {}", double(bytes_) / (1ull << 30),
                            cudaGetErrorString(e)));
  }
  auto* next = static_cast<std::byte*>(base_);
  std::vector<float> widened;
  auto vec = [&](const gguf::TensorInfo* t) -> const float* {
    if (!t) return nullptr;
    widened.resize(t->n_elements);
    gguf::dequantize(t->type, t->data, widened.data(), t->n_elements);
    cuda::check_cuda(cudaMemcpy(next, widened.data(), t->n_elements * sizeof(float), cudaMemcpyHostToDevice),
                     "GpuWeights: upload");
    const float* p = reinterpret_cast<const float*>(next);
    next += device_bytes(t);
    return p;
  };
  auto mat = [&](const gguf::TensorInfo* t) {
    cuda::DeviceMatrix dm{t->type, next, int64_t(t->dims[1]), int64_t(t->dims[0]),
                          gguf::row_bytes(t->type, t->dims[0])};
    if (stored_split(t, split)) {
      dm.layout = cuda::WeightLayout::Split;
      cuda::check_cuda(cudaMemcpy(scratch->p, t->data, t->n_bytes, cudaMemcpyHostToDevice), "GpuWeights: upload");
      cuda::launch_repack_split(scratch->p, dm, nullptr);  // the next copy on the same (legacy) stream waits for it
    } else {
      cuda::check_cuda(cudaMemcpy(next, t->data, t->n_bytes, cudaMemcpyHostToDevice), "GpuWeights: upload");
    }
    next += device_bytes(t);
    return dm;
  };
  token_embd = mat(m.token_embd);
  output_norm = vec(m.output_norm);
  output = m.output == m.token_embd ? token_embd : mat(m.output);
  matrix_bytes_ = size_t(output.rows) * output.row_bytes;
  for (const model::LayerTensors& t : m.layers) {
    GpuLayerWeights L;
    L.attn_norm = vec(t.attn_norm);
    L.wq = mat(t.wq);
    L.wk = mat(t.wk);
    L.wv = mat(t.wv);
    L.bq = vec(t.bq);
    L.bk = vec(t.bk);
    L.bv = vec(t.bv);
    L.wo = mat(t.wo);
    L.ffn_norm = vec(t.ffn_norm);
    L.w_gate = mat(t.w_gate);
    L.w_up = mat(t.w_up);
    L.w_down = mat(t.w_down);
    L.q_norm = vec(t.q_norm);
    L.k_norm = vec(t.k_norm);
    L.post_attn_norm = vec(t.post_attn_norm);
    L.post_ffn_norm = vec(t.post_ffn_norm);
    for (const cuda::DeviceMatrix* d : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
      matrix_bytes_ += size_t(d->rows) * d->row_bytes;
    layers.push_back(L);
  }
  cuda::check_cuda(cudaDeviceSynchronize(), "GpuWeights: repack");
}

GpuWeights::~GpuWeights() {
  if (base_) cudaFree(base_);
}

}  // namespace activekv::runtime
