// Chunked prefill attention. See include/activekv/cuda/prefill.h.
#include "activekv/cuda/prefill.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "device_buffer.h"

namespace activekv::cuda {

PrefillPlan plan_prefill(const AttnShape& sh, const std::vector<const void*>& pages, int64_t pos0, int n_rows) {
  sh.validate();
  if (pos0 < 0 || n_rows <= 0)
    throw InvalidArgument("plan_prefill: need pos0 >= 0 and n_rows > 0, got pos0 " + std::to_string(pos0) +
                          ", n_rows " + std::to_string(n_rows));
  const int64_t need = pos0 + n_rows;
  if (int64_t(pages.size()) * sh.page_size < need)
    throw InvalidArgument("plan_prefill: " + std::to_string(pages.size()) + " pages of " +
                          std::to_string(sh.page_size) + " tokens cannot hold " + std::to_string(need) + " tokens");
  PrefillPlan p;
  p.n_splits.resize(size_t(n_rows));
  for (int r = 0; r < n_rows; ++r) {
    const int64_t n = pos0 + r + 1;  // causal: tokens [0, pos0 + r]
    int32_t split = 0;
    for (int64_t t = 0; t < n; t += sh.split_tokens, ++split) {
      SplitWork w;
      w.page = pages[size_t(t / sh.page_size)];
      w.seq = r;
      w.tok0 = int32_t(t % sh.page_size);
      w.ntok = int32_t(std::min<int64_t>(sh.split_tokens, n - t));
      w.split = split;
      p.work.push_back(w);
    }
    p.n_splits[size_t(r)] = split;
    p.max_splits = std::max(p.max_splits, int(split));
  }
  return p;
}

PrefillAttention::PrefillAttention(const AttnShape& shape) : sh_(shape) { sh_.validate(); }

PrefillAttention::~PrefillAttention() {
  cudaFree(work_dev_);
  cudaFree(n_splits_dev_);
  cudaFree(part_o_);
  cudaFree(part_lse_);
}

void PrefillAttention::reserve(size_t n_work, size_t n_rows, int max_splits) {
  // Frees the old buffer first (and leaves null if the new one fails).
  auto grow = [](auto*& p, size_t count, const char* what) {
    cudaFree(p);
    p = nullptr;
    p = device_alloc<std::remove_reference_t<decltype(*p)>>(count, std::string("PrefillAttention: ") + what);
  };
  if (n_work > cap_work_) {
    cap_work_ = 0;
    grow(work_dev_, n_work, "the work list");
    cap_work_ = n_work;
  }
  if (n_rows > cap_rows_ || max_splits > cap_splits_) {
    const size_t rows = std::max(cap_rows_, n_rows);
    const int splits = std::max(cap_splits_, max_splits);
    cap_rows_ = 0;  // until every buffer below is allocated
    cap_splits_ = 0;
    grow(n_splits_dev_, rows, "split counts");
    const size_t prow = rows * size_t(splits) * sh_.n_q_heads();
    grow(part_o_, prow * sh_.head_dim, "partial outputs");
    grow(part_lse_, prow, "partial LSE");
    cap_rows_ = rows;
    cap_splits_ = splits;
  }
}

void PrefillAttention::run(const std::vector<const void*>& pages, int64_t pos0, int n_rows, const float* q,
                           float* out, float* out_lse, cudaStream_t stream) {
  const PrefillPlan p = plan_prefill(sh_, pages, pos0, n_rows);
  check_cuda(cudaStreamSynchronize(stream), "PrefillAttention: cudaStreamSynchronize");
  reserve(p.work.size(), size_t(n_rows), p.max_splits);
  check_cuda(cudaMemcpy(work_dev_, p.work.data(), p.work.size() * sizeof(SplitWork), cudaMemcpyHostToDevice),
             "PrefillAttention: upload work list");
  check_cuda(cudaMemcpy(n_splits_dev_, p.n_splits.data(), p.n_splits.size() * sizeof(int32_t),
                        cudaMemcpyHostToDevice),
             "PrefillAttention: upload split counts");
  // Partials are laid out with this call's max_splits as the row stride; every
  // slot a row's merge reads (split < n_splits[row]) is written by the kernel.
  const Partials parts{part_o_, part_lse_, p.max_splits};
  launch_split_attention(sh_, work_dev_, int(p.work.size()), q, parts, stream);
  launch_merge(sh_, parts, n_splits_dev_, n_rows, out, out_lse, stream);
}

}  // namespace activekv::cuda
