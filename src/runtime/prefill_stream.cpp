// See prefill_stream.h.
#include "prefill_stream.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "activekv/route/prefill_plan.h"

namespace activekv::runtime {

PrefillStream::PrefillStream(const cuda::AttnShape& attn, int n_layers, int64_t staging_pages, int max_rows)
    : attn_(attn), n_layers_(n_layers), staging_pages_(staging_pages), max_rows_(max_rows),
      page_bytes_(attn.page_bytes()) {
  if (n_layers < 1 || staging_pages < 1 || max_rows < 1)
    throw InvalidArgument(fmt::format("PrefillStream: need layers, staging pages and rows >= 1, got {}, {}, {}",
                                      n_layers, staging_pages, max_rows));
  const size_t S = size_t(staging_pages), R = size_t(max_rows), nq = size_t(attn.n_q_heads()),
               hd = size_t(attn.head_dim);
  staging_ = std::make_unique<cuda::DevBuf>(2 * S * page_bytes_,
                                            fmt::format("the prefill staging buffers (2 x {} pages)", S));
  std::vector<const void*> addr(2 * S);
  for (size_t i = 0; i < addr.size(); ++i) addr[i] = staging_->as<std::byte>() + i * page_bytes_;
  slots_ = std::make_unique<cuda::DevBuf>(addr.size() * sizeof(void*), "the staging page tables");
  cuda::check_cuda(cudaMemcpy(slots_->p, addr.data(), addr.size() * sizeof(void*), cudaMemcpyHostToDevice),
                   "upload the staging page tables");
  part_o_ = std::make_unique<cuda::DevBuf>(R * 2 * nq * hd * sizeof(float), "the prefill merge partials");
  part_lse_ = std::make_unique<cuda::DevBuf>(R * 2 * nq * sizeof(float), "the prefill merge LSE");
  seg_o_ = std::make_unique<cuda::DevBuf>(R * nq * hd * sizeof(float), "a prefill segment's output");
  seg_lse_ = std::make_unique<cuda::DevBuf>(R * nq * sizeof(float), "a prefill segment's LSE");
  const std::vector<int32_t> twos(R, 2);
  twos_ = std::make_unique<cuda::DevBuf>(R * sizeof(int32_t), "the merge counts");
  cuda::check_cuda(cudaMemcpy(twos_->p, twos.data(), R * sizeof(int32_t), cudaMemcpyHostToDevice),
                   "upload the merge counts");
  device_bytes_ = 2 * S * page_bytes_ + addr.size() * sizeof(void*) + R * (3 * nq * hd + 3 * nq + 1) * 4;
  cuda::check_cuda(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking), "PrefillStream: cudaStreamCreate");
  for (cudaEvent_t* e : {&start_, &copied_[0], &copied_[1], &consumed_[0], &consumed_[1]})
    cuda::check_cuda(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "PrefillStream: cudaEventCreate");
}

PrefillStream::~PrefillStream() {
  if (copy_) cudaStreamSynchronize(copy_);  // no copy may land in freed staging
  for (cudaEvent_t e : {start_, copied_[0], copied_[1], consumed_[0], consumed_[1]})
    if (e) cudaEventDestroy(e);
  if (copy_) cudaStreamDestroy(copy_);
}

const void* PrefillStream::slot(int b, int64_t j) const {
  return staging_->as<std::byte>() + (size_t(b) * size_t(staging_pages_) + size_t(j)) * page_bytes_;
}

int64_t PrefillStream::segments() const { return route::history_segments(history_pages_, staging_pages_); }

void PrefillStream::begin_chunk(int64_t history_pages, HostPage host_page, cudaStream_t s) {
  history_pages_ = history_pages;
  host_page_ = std::move(host_page);
  if (history_pages == 0) return;
  // Whatever the compute stream did before (uploads, the page tables) comes first.
  cuda::check_cuda(cudaEventRecord(start_, s), "PrefillStream: cudaEventRecord");
  cuda::check_cuda(cudaStreamWaitEvent(copy_, start_, 0), "PrefillStream: cudaStreamWaitEvent");
  const int64_t items = int64_t(n_layers_) * segments();
  for (int64_t i = 0; i < std::min<int64_t>(items, 2); ++i) copy_item(i);
}

// Item i = (layer i / segments, segment i % segments) into buffer i % 2, once
// the attention that last read that buffer is done.
void PrefillStream::copy_item(int64_t i) {
  const int64_t n_seg = segments();
  const int b = int(i % 2);
  const int l = int(i / n_seg);
  const int64_t p0 = (i % n_seg) * staging_pages_, p1 = std::min(p0 + staging_pages_, history_pages_);
  cuda::check_cuda(cudaStreamWaitEvent(copy_, consumed_[b], 0), "PrefillStream: cudaStreamWaitEvent");
  for (int64_t p = p0; p < p1; ++p) {
    cuda::check_cuda(cudaMemcpyAsync(const_cast<void*>(slot(b, p - p0)), host_page_(l, size_t(p)), page_bytes_,
                                     cudaMemcpyHostToDevice, copy_),
                     "stage a history page");
    moved_ += page_bytes_;
  }
  cuda::check_cuda(cudaEventRecord(copied_[b], copy_), "PrefillStream: cudaEventRecord");
}

void PrefillStream::wait_copied(int64_t i, cudaStream_t s) {
  cuda::check_cuda(cudaStreamWaitEvent(s, copied_[i % 2], 0), "PrefillStream: cudaStreamWaitEvent");
}

// Item i's attention is enqueued: its buffer is free once `s` gets here, and
// item i + 2 may be copied into it.
void PrefillStream::consumed(int64_t i, cudaStream_t s) {
  cuda::check_cuda(cudaEventRecord(consumed_[i % 2], s), "PrefillStream: cudaEventRecord");
  if (i + 2 < int64_t(n_layers_) * segments()) copy_item(i + 2);
}

// seg_o_ / seg_lse_ ([rows][n_q_heads](...)) -> partial slot `slot` of each row.
void PrefillStream::to_slot(int slot, int rows, cudaStream_t s) {
  const size_t nq = size_t(attn_.n_q_heads()), o_row = nq * size_t(attn_.head_dim) * sizeof(float),
               l_row = nq * sizeof(float);
  cuda::check_cuda(cudaMemcpy2DAsync(part_o_->as<std::byte>() + size_t(slot) * o_row, 2 * o_row, seg_o_->p, o_row,
                                     o_row, size_t(rows), cudaMemcpyDeviceToDevice, s),
                   "place a partial");
  cuda::check_cuda(cudaMemcpy2DAsync(part_lse_->as<std::byte>() + size_t(slot) * l_row, 2 * l_row, seg_lse_->p,
                                     l_row, l_row, size_t(rows), cudaMemcpyDeviceToDevice, s),
                   "place a partial's LSE");
}

// Merges each row's two partials (earlier keys first) into out (and seg_lse_).
void PrefillStream::merge(int rows, float* out, cudaStream_t s) {
  cuda::launch_merge(attn_, cuda::Partials{part_o_->as<float>(), part_lse_->as<float>(), 2}, twos_->as<int32_t>(),
                     rows, out, seg_lse_->as<float>(), s);
}

void PrefillStream::attend(int l, const void* const* layer_table, int64_t n_pages, int64_t pos0, int rows,
                           const float* q, float* out, cuda::PrefillAttention& pa, cudaStream_t s) {
  if (rows > max_rows_)
    throw InvalidArgument(fmt::format("PrefillStream: {} rows, the merge buffers hold {}", rows, max_rows_));
  const int64_t H = history_pages_;
  if (H == 0) {
    pa.run(layer_table, n_pages, pos0, rows, q, out, nullptr, s);
    return;
  }
  const int64_t n_seg = segments();
  if (n_seg == 1) {  // whole layer: the resident call over the staged copies
    wait_copied(l, s);
    pa.run(layer_table, n_pages, pos0, rows, q, out, nullptr, s);
    consumed(l, s);
    return;
  }
  float* so = seg_o_->as<float>();
  float* sl = seg_lse_->as<float>();
  const void* const* slots = slots_->as<const void*>();
  for (int64_t seg = 0; seg < n_seg; ++seg) {
    const int64_t i = int64_t(l) * n_seg + seg;
    const int64_t pages = std::min(staging_pages_, H - seg * staging_pages_);
    wait_copied(i, s);
    pa.run_keys(slots + (i % 2) * staging_pages_, pages, pages * attn_.page_size, rows, q, so, sl, s);
    consumed(i, s);
    to_slot(seg == 0 ? 0 : 1, rows, s);
    if (seg == 0) continue;
    merge(rows, so, s);
    to_slot(0, rows, s);
  }
  // The chunk's own pages (and the earlier tokens of its first page), causally.
  pa.run(layer_table + H, n_pages - H, pos0 - H * attn_.page_size, rows, q, so, sl, s);
  to_slot(1, rows, s);
  merge(rows, out, s);
}

void PrefillStream::synchronize() {
  cuda::check_cuda(cudaStreamSynchronize(copy_), "PrefillStream: cudaStreamSynchronize");
}

}  // namespace activekv::runtime
