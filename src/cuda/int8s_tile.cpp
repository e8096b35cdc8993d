// Int8sTileRunner: see include/activekv/cuda/int8s_tile.h.
#include "activekv/cuda/int8s_tile.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "activekv/kv/codec_int8s.h"
#include "cuda_check.h"
#include "device_buffer.h"

namespace activekv::cuda {

attention::Partial Int8sTileRunner::operator()(std::span<const kv::EncodedPage* const> pages, int64_t first_token,
                                               int64_t history_tokens, const attention::QueryRows& q,
                                               const attention::AttentionOptions& opt) const {
  if (pages.empty()) throw InvalidArgument("Int8sTileRunner: no pages");
  if (first_token < 0) throw InvalidArgument("Int8sTileRunner: first_token is " + std::to_string(first_token));
  if (!pages.front()) throw InvalidArgument("Int8sTileRunner: page 0 is null");
  // Pages past the history's end are not read (as on the CPU); the rest are
  // validated (header, checksum, scales, codes) before anything is uploaded.
  const int64_t ps0 = kv::read_header(pages.front()->bytes).page_size;
  const size_t n_read = std::min(pages.size(), size_t(std::max<int64_t>(1, (history_tokens - first_token + ps0 - 1) / ps0)));
  std::vector<kv::Int8sPageView> views;
  for (size_t i = 0; i < n_read; ++i) {
    if (!pages[i]) throw InvalidArgument("Int8sTileRunner: page " + std::to_string(i) + " is null");
    views.push_back(kv::parse_int8s_page(*pages[i]));
  }
  return (*this)(std::span<const kv::Int8sPageView>(views), first_token, history_tokens, q, opt);
}

attention::Partial Int8sTileRunner::operator()(std::span<const kv::Int8sPageView> pages, int64_t first_token,
                                               int64_t history_tokens, const attention::QueryRows& q,
                                               const attention::AttentionOptions& opt) const {
  if (pages.empty()) throw InvalidArgument("Int8sTileRunner: no pages");
  if (first_token < 0) throw InvalidArgument("Int8sTileRunner: first_token is " + std::to_string(first_token));
  // The CPU tile it stands in for applies a sliding window; this one reads
  // every visible token, so a window is refused, not ignored (as the route does).
  if (opt.window > 0)
    throw InvalidArgument("Int8sTileRunner: a sliding window (" + std::to_string(opt.window) + " tokens) is not supported");
  const int64_t ps0 = pages.front().header.page_size;
  pages = pages.first(std::min(pages.size(), size_t(std::max<int64_t>(1, (history_tokens - first_token + ps0 - 1) / ps0))));
  std::vector<kv::PageHeader> headers;
  for (const kv::Int8sPageView& v : pages) headers.push_back(v.header);
  const kv::PageHeader& h0 = headers.front();
  for (size_t i = 0; i < headers.size(); ++i) {
    const kv::PageHeader& h = headers[i];
    if (h.page_size != h0.page_size || h.n_kv_heads != h0.n_kv_heads || h.head_dim != h0.head_dim)
      throw InvalidArgument("Int8sTileRunner: page " + std::to_string(i) + " (page " + std::to_string(h.page_size) +
                            ", heads " + std::to_string(h.n_kv_heads) + ", dim " + std::to_string(h.head_dim) +
                            ") differs from page 0 (page " + std::to_string(h0.page_size) + ", heads " +
                            std::to_string(h0.n_kv_heads) + ", dim " + std::to_string(h0.head_dim) + ")");
  }
  if (q.n_heads % h0.n_kv_heads != 0)
    throw InvalidArgument("Int8sTileRunner: " + std::to_string(q.n_heads) + " query heads are not a multiple of " +
                          std::to_string(h0.n_kv_heads) + " KV heads");
  AttnShape sh;
  sh.n_kv_heads = h0.n_kv_heads;
  sh.group = q.n_heads / h0.n_kv_heads;
  sh.head_dim = h0.head_dim;
  sh.page_size = h0.page_size;
  sh.split_tokens = default_split_tokens(h0.page_size);
  sh.softmax_scale = opt.softmax_scale;
  sh.validate();
  const int64_t ps = sh.page_size;
  const int spp = sh.page_size / sh.split_tokens;
  const int64_t end = std::min<int64_t>(history_tokens, first_token + int64_t(pages.size()) * ps);

  // Upload (the kernel addresses a page's sections by page_size, so pages are full; checked below).
  std::vector<size_t> offs;
  size_t total = 0;
  for (const kv::Int8sPageView& p : pages) {
    offs.push_back(total);
    total += (p.blob.size() + 255) / 256 * 256;
  }
  DevBuf dpages(total);
  for (size_t i = 0; i < pages.size(); ++i)
    AKV_CUDA(cudaMemcpy(dpages.as<std::byte>() + offs[i], pages[i].blob.data(), pages[i].blob.size(),
                        cudaMemcpyHostToDevice));

  std::vector<SplitWork> work;
  const int max_splits = int(pages.size()) * spp;
  for (int r = 0; r < q.n_rows; ++r) {
    const int64_t pos = q.positions[r];
    if (pos < 0 || pos >= history_tokens)
      throw InvalidArgument("Int8sTileRunner: query position " + std::to_string(pos) + " outside [0, " +
                            std::to_string(history_tokens) + ")");
    const int64_t row_end = std::min(end, pos + 1);
    for (size_t i = 0; i < pages.size(); ++i) {
      const int64_t t_page = first_token + int64_t(i) * ps;
      const int64_t visible = std::min<int64_t>(row_end - t_page, ps);
      if (visible <= 0) break;
      if (visible > headers[i].n_tokens)
        throw InvalidArgument("Int8sTileRunner: page " + std::to_string(i) + " holds " +
                              std::to_string(headers[i].n_tokens) + " tokens, the tile needs " + std::to_string(visible));
      if (headers[i].n_tokens != ps)
        throw InvalidArgument("Int8sTileRunner: page " + std::to_string(i) + " holds " +
                              std::to_string(headers[i].n_tokens) + " of " + std::to_string(ps) +
                              " tokens; the GPU kernel reads full int8s pages only");
      for (int k = 0; k < spp; ++k) {
        const int64_t t0 = int64_t(k) * sh.split_tokens;
        if (t0 >= visible) break;
        work.push_back(SplitWork{dpages.as<std::byte>() + offs[i], r, int32_t(t0),
                                 int32_t(std::min<int64_t>(sh.split_tokens, visible - t0)), int32_t(i * spp + k)});
      }
    }
  }
  const size_t rows = size_t(q.n_rows) * q.n_heads;
  attention::Partial out(q.n_rows, q.n_heads, sh.head_dim);
  if (work.empty()) return out;  // no row sees a key of this tile
  DevBuf dwork(work.size() * sizeof(SplitWork)), dq(rows * sh.head_dim * 4);
  DevBuf po(rows * max_splits * sh.head_dim * 4), pl(rows * max_splits * 4);
  DevBuf dout(rows * sh.head_dim * 4), dlse(rows * 4), dn(q.n_rows * 4);
  AKV_CUDA(cudaMemcpy(dwork.p, work.data(), work.size() * sizeof(SplitWork), cudaMemcpyHostToDevice));
  AKV_CUDA(cudaMemcpy(dq.p, q.q, rows * sh.head_dim * 4, cudaMemcpyHostToDevice));
  const std::vector<float> ninf(rows * max_splits, -__builtin_inff());
  AKV_CUDA(cudaMemcpy(pl.p, ninf.data(), ninf.size() * 4, cudaMemcpyHostToDevice));
  const std::vector<int32_t> n_splits(size_t(q.n_rows), max_splits);
  AKV_CUDA(cudaMemcpy(dn.p, n_splits.data(), n_splits.size() * 4, cudaMemcpyHostToDevice));
  Int8sKernelOptions kopt = kernel_;
  kopt.query_terms = opt.int8s_query_terms;
  const Partials parts{po.as<float>(), pl.as<float>(), max_splits};
  launch_split_attention_int8s(sh, dwork.as<SplitWork>(), int(work.size()), dq.as<float>(), parts, kopt, nullptr);
  launch_merge(sh, parts, dn.as<int32_t>(), q.n_rows, dout.as<float>(), dlse.as<float>(), nullptr);
  AKV_CUDA(cudaMemcpy(out.o.data(), dout.p, rows * sh.head_dim * 4, cudaMemcpyDeviceToHost));
  AKV_CUDA(cudaMemcpy(out.lse.data(), dlse.p, rows * 4, cudaMemcpyDeviceToHost));
  return out;
}

}  // namespace activekv::cuda
