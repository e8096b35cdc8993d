#include "activekv/runtime/gpu_weights.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "activekv/cuda/device_pages.h"
#include "device_buffer.h"
#include "activekv/gguf/tensor_type.h"
#include "activekv/model/tensor_split.h"
#include "activekv/model/tensors.h"

namespace activekv::runtime {
namespace {

constexpr size_t kAlign = 256;
size_t aligned(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

bool is_vector(const gguf::TensorInfo* t) { return t && t->dims.size() == 1; }

// What this GPU holds of `t`: all of it, or a tensor-parallel shard's slice.
model::TensorSlice held(const gguf::TensorInfo* t, const model::TensorSplitPlan* split, int shard) {
  if (split) return split->slice(shard, t);
  return {model::TensorSlice::Cut::whole, 0, t->dims.size() > 1 ? int64_t(t->dims[1]) : 1, t->n_bytes};
}

// Device bytes of (the held part of) one tensor: as stored for a matrix, fp32 for a vector.
size_t device_bytes(const gguf::TensorInfo* t, const model::TensorSplitPlan* split, int shard) {
  if (!t) return 0;
  const model::TensorSlice h = held(t, split, shard);
  if (is_vector(t)) return aligned(size_t(h.held_cols(*t)) * sizeof(float));
  return aligned(h.bytes);
}

// Copies the held part of matrix `t` (its slice's byte runs) to `dst`, rows back to back.
void upload_held(const gguf::TensorInfo* t, const model::TensorSlice& h, void* dst) {
  const model::TensorSlice::Runs r = h.runs(*t);
  if (r.offset + r.run_bytes > t->n_bytes || (r.count > 1 && r.offset + uint64_t(r.count - 1) * r.stride + r.run_bytes > t->n_bytes))
    throw InvalidArgument(fmt::format("GpuWeights: the slice of '{}' lies outside its data", t->name));
  const uint8_t* src = t->data + r.offset;
  if (r.count == 1) {
    cuda::check_cuda(cudaMemcpy(dst, src, r.run_bytes, cudaMemcpyHostToDevice), "GpuWeights: upload");
  } else {  // a column cut: one run of blocks per row
    cuda::check_cuda(cudaMemcpy2D(dst, r.run_bytes, src, r.stride, r.run_bytes, size_t(r.count), cudaMemcpyHostToDevice),
                     "GpuWeights: upload of a column slice");
  }
}

// With a tensor-parallel split and a tied head, a shard holds its rows of the
// head beside the whole embedding (GpuWeights::output); else none.
size_t tied_head_bytes(const model::ModelTensors& m, const model::TensorSplitPlan* split, int shard) {
  return split && m.output == m.token_embd ? aligned(split->head(shard).bytes) : 0;
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

size_t GpuWeights::bytes_needed(const gguf::File& f, const model::ModelConfig& c, const model::TensorSplitPlan* split,
                                int shard) {
  const model::ModelTensors m = model::ModelTensors::find(f, c);
  size_t n = tied_head_bytes(m, split, shard);
  for_each_tensor(m, [&](const gguf::TensorInfo* t) { n += device_bytes(t, split, shard); });
  return n;
}

GpuWeights::GpuWeights(const gguf::File& f, const model::ModelConfig& c, const model::TensorSplitPlan* tp, int shard) {
  const model::ModelTensors m = model::ModelTensors::find(f, c);
  if (tp && (shard < 0 || shard >= tp->n_shards))
    throw InvalidArgument(fmt::format("GpuWeights: shard {} of a {}-way split", shard, tp->n_shards));
  for_each_tensor(m, [&](const gguf::TensorInfo* t) {
    if (!is_vector(t)) cuda::require_gpu_kernel(t->name, t->type);
    else if (!gguf::is_supported(t->type))
      throw Error(fmt::format("tensor '{}' has type {}, which ActiveKV cannot read", t->name, gguf::type_name(t->type)));
    bytes_ += device_bytes(t, tp, shard);
  });
  bytes_ += tied_head_bytes(m, tp, shard);
  // Split matrices are uploaded into a scratch buffer and repacked from
  // there: the largest of them is needed beside the weights while loading.
  const bool split = cuda::split_layout_wanted();
  size_t scratch_bytes = 0;
  for_each_tensor(m, [&](const gguf::TensorInfo* t) {
    if (stored_split(t, split)) scratch_bytes = std::max(scratch_bytes, size_t(held(t, tp, shard).bytes));
  });
  if (tp && stored_split(m.output, split)) scratch_bytes = std::max(scratch_bytes, size_t(tp->head(shard).bytes));
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
    const model::TensorSlice h = held(t, tp, shard);  // a bias: the shard's heads' elements
    const int64_t first = h.cut == model::TensorSlice::Cut::cols ? h.begin : 0, n = h.held_cols(*t);
    widened.resize(t->n_elements);
    gguf::dequantize(t->type, t->data, widened.data(), t->n_elements);
    cuda::check_cuda(cudaMemcpy(next, widened.data() + first, size_t(n) * sizeof(float), cudaMemcpyHostToDevice),
                     "GpuWeights: upload");
    const float* p = reinterpret_cast<const float*>(next);
    next += device_bytes(t, tp, shard);
    return p;
  };
  auto mat = [&](const gguf::TensorInfo* t, const model::TensorSlice& h) {
    const int64_t cols = h.held_cols(*t);
    cuda::DeviceMatrix dm{t->type, next, h.held_rows(*t), cols, gguf::row_bytes(t->type, uint64_t(cols))};
    if (stored_split(t, split)) {
      dm.layout = cuda::WeightLayout::Split;
      upload_held(t, h, scratch->p);
      cuda::launch_repack_split(scratch->p, dm, nullptr);  // the next copy on the same (legacy) stream waits for it
    } else {
      upload_held(t, h, next);
    }
    next += aligned(h.bytes);
    return dm;
  };
  token_embd = mat(m.token_embd, held(m.token_embd, tp, shard));
  output_norm = vec(m.output_norm);
  if (tp) {
    output = mat(m.output, tp->head(shard));  // the shard's vocabulary rows (of the embedding when tied)
  } else {
    output = m.output == m.token_embd ? token_embd : mat(m.output, held(m.output, tp, shard));
  }
  matrix_bytes_ = size_t(output.rows) * output.row_bytes;
  for (const model::LayerTensors& t : m.layers) {
    GpuLayerWeights L;
    L.attn_norm = vec(t.attn_norm);
    L.wq = mat(t.wq, held(t.wq, tp, shard));
    L.wk = mat(t.wk, held(t.wk, tp, shard));
    L.wv = mat(t.wv, held(t.wv, tp, shard));
    L.bq = vec(t.bq);
    L.bk = vec(t.bk);
    L.bv = vec(t.bv);
    L.wo = mat(t.wo, held(t.wo, tp, shard));
    L.ffn_norm = vec(t.ffn_norm);
    L.w_gate = mat(t.w_gate, held(t.w_gate, tp, shard));
    L.w_up = mat(t.w_up, held(t.w_up, tp, shard));
    L.w_down = mat(t.w_down, held(t.w_down, tp, shard));
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
