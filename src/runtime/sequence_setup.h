// Internal to the GPU runtime: how a history is set up on a model, shared by
// the one-GPU sequence (gpu_sequence.cpp) and the tensor-parallel runtime
// (tensor_parallel_runtime.cpp): the checks of options and tokens, the
// attention shape, the layers' windows and the decode engine's config.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <vector>

#include "activekv/cuda/decode_engine.h"
#include "activekv/model/config.h"
#include "activekv/runtime/runtime_options.h"

namespace activekv::runtime {

/// Throws InvalidArgument for options no sequence accepts (n_ctx,
/// prefill_chunk, cpu_share, an observer with CUDA graphs): before any
/// GPU work, so GpuRuntime calls it before loading the weights.
void check_sequence_options(const RuntimeOptions& opt, bool observer);

/// The attention shape of a sequence of `opt` on model `c` (every KV head).
/// Throws Error ("this model cannot run on the GPU yet: ...") for a shape
/// the kernels do not take.
cuda::AttnShape sequence_attn_shape(const model::ModelConfig& c, const RuntimeOptions& opt);

/// [model layer] each layer's sliding window (0: it attends the whole history).
std::vector<int> layer_windows(const model::ModelConfig& c);

/// Throws InvalidArgument for a token id outside c's vocabulary, or when
/// `n_tokens` held plus the new ones would pass n_ctx (one line each).
void check_sequence_tokens(const model::ModelConfig& c, std::span<const int32_t> tokens, int64_t n_tokens,
                           int64_t n_ctx);

/// The decode engine a sequence of `opt` on model `c` runs (attention shape
/// `attn`, enqueued on the model's `stream`).
cuda::EngineConfig sequence_engine_config(const model::ModelConfig& c, const RuntimeOptions& opt,
                                          const cuda::AttnShape& attn, cudaStream_t stream);

/// A device array of the positions 0 .. n_ctx - 1 on the current GPU (a row
/// at position p reads pos + p), uploaded once. Throws CudaError naming
/// `who` when it cannot be had. The caller frees it (cudaFree).
int64_t* upload_positions(int64_t n_ctx, const char* who);

}  // namespace activekv::runtime
