// The model's exact attention on the GPU. See include/activekv/cuda/attention_backend.h.
#include "activekv/cuda/attention_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "activekv/cuda/prefill.h"
#include "device_buffer.h"

namespace activekv::cuda {
namespace {

// fp32-accurate (3 bf16 terms): this backend is the model's exact-attention
// reference on the GPU, checked against the CPU path to fp32 tolerance.
PrefillConfig prefill_config() {
  PrefillConfig c;
  c.terms = 3;
  return c;
}

}  // namespace

CudaAttentionBackend::CudaAttentionBackend(const kv::KvShape& shape, int n_heads, int split_tokens, int device)
    : shape_(shape) {
  shape_.validate();
  if (shape_.format != kv::PageFormat::bf16)
    throw InvalidArgument("CudaAttentionBackend: only bf16 pages are supported on the GPU");
  if (n_heads <= 0 || n_heads % shape_.n_kv_heads != 0)
    throw InvalidArgument("CudaAttentionBackend: " + std::to_string(n_heads) +
                          " query heads is not a multiple of " + std::to_string(shape_.n_kv_heads) + " KV heads");
  attn_.n_kv_heads = shape_.n_kv_heads;
  attn_.group = n_heads / shape_.n_kv_heads;
  attn_.head_dim = shape_.head_dim;
  attn_.page_size = shape_.page_size;
  attn_.split_tokens = split_tokens > 0 ? split_tokens : default_split_tokens(shape_.page_size);
  attn_.softmax_scale = 0.f;
  attn_.validate();
  require_gpu(device, "--device cuda (use --device cpu)");
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, device), "CudaAttentionBackend: cudaGetDeviceProperties");
  device_name_ = prop.name;
  check_cuda(cudaStreamCreate(&stream_), "CudaAttentionBackend: cudaStreamCreate");
  prefill_ = std::make_unique<PrefillAttention>(attn_, prefill_config());
  mirrored_.assign(size_t(shape_.n_layers), 0);
  tables_.resize(size_t(shape_.n_layers));
}

CudaAttentionBackend::~CudaAttentionBackend() {
  if (stream_) cudaStreamSynchronize(stream_);
  prefill_.reset();
  for (void* p : dev_pages_) cudaFree(p);
  cudaFree(q_dev_);
  cudaFree(o_dev_);
  cudaFree(lse_dev_);
  cudaFree(table_dev_);
  if (stream_) cudaStreamDestroy(stream_);
}

void* CudaAttentionBackend::device_page(kv::PageId id) {
  if (id >= dev_pages_.size()) dev_pages_.resize(size_t(id) + 1, nullptr);
  if (!dev_pages_[id]) {
    dev_pages_[id] = device_malloc(shape_.page_bytes(), "CudaAttentionBackend: a page");
    ++n_dev_pages_;
  }
  return dev_pages_[id];
}

// Brings tokens [0, h.n_tokens) of `layer` onto the GPU, copying only what may
// have changed since the last call: tokens from the first page whose id
// differs from the remembered table, from the old mirror end, and from the
// first query row (just written by the model).
void CudaAttentionBackend::mirror(int layer, const attention::LayerHistory& h, int64_t first_row_pos) {
  const int ps = shape_.page_size;
  std::vector<kv::PageId>& old = tables_[size_t(layer)];
  int64_t from = std::min(mirrored_[size_t(layer)], first_row_pos);
  const size_t common = std::min(old.size(), h.page_table.size());
  for (size_t i = 0; i < common && int64_t(i) * ps < from; ++i) {
    if (old[i] != h.page_table[i]) {
      from = int64_t(i) * ps;
      break;
    }
  }
  if (int64_t(h.page_table.size()) * ps < from) from = int64_t(h.page_table.size()) * ps;
  const size_t row_bytes = size_t(shape_.head_dim) * 2;  // one token of one plane, bf16
  for (int64_t t = from; t < h.n_tokens;) {
    const size_t pi = size_t(t / ps);
    const int64_t t0 = t % ps;
    const int64_t t1 = std::min<int64_t>(ps, h.n_tokens - int64_t(pi) * ps);
    const kv::PageId id = h.page_table[pi];
    std::byte* dst = static_cast<std::byte*>(device_page(id));
    const std::byte* src = h.store->k_plane(id, 0);  // K planes then V planes, contiguous
    // 2 * n_kv_heads planes, each [page_size][head_dim]: copy rows [t0, t1) of every plane.
    check_cuda(cudaMemcpy2DAsync(dst + size_t(t0) * row_bytes, shape_.plane_bytes(), src + size_t(t0) * row_bytes,
                                 shape_.plane_bytes(), size_t(t1 - t0) * row_bytes, size_t(2 * shape_.n_kv_heads),
                                 cudaMemcpyHostToDevice, stream_),
               "CudaAttentionBackend: page upload");
    bytes_uploaded_ += size_t(t1 - t0) * row_bytes * size_t(2 * shape_.n_kv_heads);
    t = int64_t(pi + 1) * ps;
  }
  old.assign(h.page_table.begin(), h.page_table.end());
  mirrored_[size_t(layer)] = h.n_tokens;
}

attention::Partial CudaAttentionBackend::attend(int layer, const attention::LayerHistory& h,
                                                const attention::QueryRows& q, const attention::AttentionOptions& opt) {
  if (layer < 0 || layer >= shape_.n_layers)
    throw InvalidArgument("CudaAttentionBackend: layer " + std::to_string(layer) + " out of range");
  if (!h.store || h.store->shape().format != kv::PageFormat::bf16 ||
      h.store->shape().page_size != shape_.page_size || h.store->shape().n_kv_heads != shape_.n_kv_heads ||
      h.store->shape().head_dim != shape_.head_dim)
    throw InvalidArgument("CudaAttentionBackend: the history's store does not have the backend's bf16 shape");
  if (q.n_rows <= 0 || !q.q || !q.positions || q.n_heads != attn_.n_q_heads())
    throw InvalidArgument("CudaAttentionBackend: bad query rows (need n_rows > 0 and " +
                          std::to_string(attn_.n_q_heads()) + " heads)");
  if (h.read_planes) throw InvalidArgument("CudaAttentionBackend: read_planes histories are not supported");
  int64_t first = q.positions[0];
  for (int r = 0; r < q.n_rows; ++r) {
    const int64_t p = q.positions[r];
    if (p < 0 || p >= h.n_tokens)
      throw InvalidArgument("CudaAttentionBackend: query position " + std::to_string(p) +
                            " outside the history of " + std::to_string(h.n_tokens) + " tokens");
    first = std::min(first, p);
  }
  if (int64_t(h.page_table.size()) * shape_.page_size < h.n_tokens)
    throw InvalidArgument("CudaAttentionBackend: page table too short for the history");
  if (opt.softmax_scale != attn_.softmax_scale) {
    attn_.softmax_scale = opt.softmax_scale;
    attn_.validate();
    prefill_ = std::make_unique<PrefillAttention>(attn_, prefill_config());
  }
  mirror(layer, h, first);

  const size_t nq = size_t(attn_.n_q_heads()), hd = size_t(attn_.head_dim), rows = size_t(q.n_rows);
  if (rows > cap_rows_) {
    cudaFree(q_dev_);
    cudaFree(o_dev_);
    cudaFree(lse_dev_);
    q_dev_ = o_dev_ = lse_dev_ = nullptr;
    cap_rows_ = 0;
    q_dev_ = device_alloc<float>(rows * nq * hd, "CudaAttentionBackend: queries");
    o_dev_ = device_alloc<float>(rows * nq * hd, "CudaAttentionBackend: outputs");
    lse_dev_ = device_alloc<float>(rows * nq, "CudaAttentionBackend: LSE");
    cap_rows_ = rows;
  }
  check_cuda(cudaMemcpyAsync(q_dev_, q.q, rows * nq * hd * sizeof(float), cudaMemcpyHostToDevice, stream_),
             "CudaAttentionBackend: query upload");
  // The layer's device page table (every page of the history has a device
  // page after mirror()); the stream is idle here (attend ends synchronised),
  // so the table can be regrown and rewritten.
  const size_t n_pages = size_t((h.n_tokens + shape_.page_size - 1) / shape_.page_size);
  table_host_.resize(n_pages);
  for (size_t i = 0; i < n_pages; ++i) table_host_[i] = dev_pages_[h.page_table[i]];
  if (n_pages > cap_table_) {
    cudaFree(table_dev_);
    table_dev_ = nullptr;
    cap_table_ = 0;
    table_dev_ = device_alloc<const void*>(n_pages, "CudaAttentionBackend: the page table");
    cap_table_ = n_pages;
  }
  check_cuda(cudaMemcpyAsync(table_dev_, table_host_.data(), n_pages * sizeof(void*), cudaMemcpyHostToDevice,
                             stream_),
             "CudaAttentionBackend: page table upload");
  for (int r = 0; r < q.n_rows;) {
    // A run of consecutive positions is one PrefillAttention::run (one row: a decode step).
    int n = 1;
    while (r + n < q.n_rows && q.positions[r + n] == q.positions[r] + n) ++n;
    const size_t off = size_t(r) * nq;
    prefill_->run(table_dev_, int64_t(n_pages), q.positions[r], n, q_dev_ + off * hd, o_dev_ + off * hd,
                  lse_dev_ + off, stream_);
    r += n;
  }
  attention::Partial out(q.n_rows, q.n_heads, attn_.head_dim);
  check_cuda(cudaMemcpyAsync(out.o.data(), o_dev_, out.o.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_),
             "CudaAttentionBackend: output download");
  check_cuda(cudaMemcpyAsync(out.lse.data(), lse_dev_, out.lse.size() * sizeof(float), cudaMemcpyDeviceToHost,
                             stream_),
             "CudaAttentionBackend: LSE download");
  check_cuda(cudaStreamSynchronize(stream_), "CudaAttentionBackend: cudaStreamSynchronize");
  return out;
}

}  // namespace activekv::cuda
