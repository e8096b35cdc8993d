// How a history is set up on a model. See sequence_setup.h.
#include "sequence_setup.h"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "activekv/core/error.h"
#include "device_buffer.h"

namespace activekv::runtime {

cuda::AttnShape sequence_attn_shape(const model::ModelConfig& c, const RuntimeOptions& o) {
  cuda::AttnShape a;
  a.n_kv_heads = c.n_kv_heads;
  a.group = c.n_heads / c.n_kv_heads;
  a.head_dim = c.head_dim;
  a.page_size = o.page_size;
  a.split_tokens = o.split_tokens > 0 ? o.split_tokens : cuda::default_split_tokens(o.page_size);
  a.softmax_scale = c.query_scale;  // 1/sqrt(attention.key_length); 0 (unset) = 1/sqrt(head_dim)
  try {
    a.validate();
  } catch (const InvalidArgument& e) {
    throw Error(fmt::format("this model cannot run on the GPU yet: {}", e.what()));
  }
  return a;
}

std::vector<int> layer_windows(const model::ModelConfig& c) {
  std::vector<int> w;
  for (const model::LayerAttention& a : c.layer_attention) w.push_back(a.window);
  w.resize(size_t(c.n_layers), 0);
  return w;
}

cuda::EngineConfig sequence_engine_config(const model::ModelConfig& c, const RuntimeOptions& opt,
                                          const cuda::AttnShape& attn, cudaStream_t stream) {
  cuda::EngineConfig ec;
  ec.n_layers = c.n_layers;
  ec.attn = attn;
  ec.tile_pages = opt.route.tile_pages;
  ec.cpu_kernels.threads = opt.cpu_threads > 0 ? opt.cpu_threads
                                                : std::max(1, int(std::thread::hardware_concurrency()) - 1);
  ec.windows = layer_windows(c);
  ec.compute_stream = stream;  // every sequence's work in the model's one stream
  return ec;
}

void check_sequence_options(const RuntimeOptions& opt, bool observer) {
  if (opt.n_ctx <= 0) throw InvalidArgument("GpuRuntime: n_ctx must be positive");
  if (opt.prefill_chunk <= 0) throw InvalidArgument("GpuRuntime: prefill_chunk must be positive");
  if (!(opt.cpu_share == -1 || (opt.cpu_share >= 0 && opt.cpu_share < 1)))
    throw InvalidArgument(fmt::format("GpuRuntime: the CPU share must be in [0, 1) or -1 (auto), got {}", opt.cpu_share));
  if (observer && opt.cuda_graphs)
    throw InvalidArgument("GpuRuntime: an observer synchronises every stage and cannot run inside CUDA graphs");
}

void check_sequence_tokens(const model::ModelConfig& c, std::span<const int32_t> tokens, int64_t n_tokens,
                           int64_t n_ctx) {
  for (int32_t id : tokens)
    if (id < 0 || id >= c.vocab_size)
      throw InvalidArgument(fmt::format("token id {} outside the vocabulary of {}", id, c.vocab_size));
  if (n_tokens + int64_t(tokens.size()) > n_ctx)
    throw InvalidArgument(fmt::format("the history would hold {} tokens, the context is {} (-c)",
                                      n_tokens + int64_t(tokens.size()), n_ctx));
}

int64_t* upload_positions(int64_t n_ctx, const char* who) {
  int64_t* pos = cuda::device_alloc<int64_t>(size_t(n_ctx), fmt::format("{}: positions", who));
  std::vector<int64_t> p(static_cast<size_t>(n_ctx));
  for (size_t i = 0; i < p.size(); ++i) p[i] = int64_t(i);
  const cudaError_t e = cudaMemcpy(pos, p.data(), p.size() * sizeof(int64_t), cudaMemcpyHostToDevice);
  if (e != cudaSuccess) {
    cudaFree(pos);
    cuda::check_cuda(e, fmt::format("{}: upload positions", who).c_str());
  }
  return pos;
}

}  // namespace activekv::runtime
