// The Llama-family forward pass on the GPU (llama, qwen2, gemma3), for a
// block of T token rows: T = 1 (or a few, batched) in decode, a chunk in
// prefill.
//
// Per layer, as the CPU reference (activekv/model/llama_model.h):
//   n = RMSNorm(x); q,k,v = W{q,k,v} n (+ bias for qwen2);
//   gemma3: q, k = RMSNorm per head (QK-norm); RoPE(q, k) with the layer's base;
//   a = attention(q, k, v)  -- the caller's LayerAttention: it stores k, v in
//                              the history and attends over it (a sliding
//                              layer only its window);
//   x += Wo a; m = RMSNorm(x); x += W_down (act(W_gate m) * (W_up m)),
//   act = silu (SwiGLU) or tanh-GELU (GeGLU, gemma3); gemma3 normalises each
//   of the two outputs (post-attention and post-FFN RMSNorm) before its add.
// The embedding rows are scaled by ModelConfig::embed_scale (gemma3:
// sqrt(d_model)). Then the head: logits = W_out RMSNorm(x) for the last row
// (or every row); W_out is the embedding table when tied.
// Projections read the weights in their GGUF types: a quantised matvec with
// int8 activations for up to kMatvecRows rows, a bf16 cuBLAS GEMM above
// (activekv/cuda/quant_matvec.h, weight_gemm.h). With f32_activations every
// projection, prefill included, is a matvec of dequantised weights and fp32
// activations, 8 rows per launch: the CPU path's arithmetic, for comparisons. Everything is enqueued on
// one stream; nothing synchronises the host.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <utility>
#include <memory>
#include <vector>

#include "activekv/cuda/decode_attention.h"
#include "activekv/cuda/model_ops.h"
#include "activekv/cuda/weight_gemm.h"
#include "activekv/model/config.h"
#include "activekv/model/llama_model.h"
#include "activekv/runtime/gpu_weights.h"

typedef struct CUstream_st* cudaStream_t;

namespace activekv::runtime {

/// One layer's attention over the history, enqueued on the forward's stream:
/// q [T][n_heads*head_dim] (RoPE applied), k, v [T][n_kv_heads*head_dim]
/// (k with RoPE) of rows at positions pos0 .. pos0+T-1 -> out [T][n_heads*head_dim].
/// Device fp32 pointers, valid during the call's enqueued work. `out_int8`
/// (codes null: not wanted): where out's rows may also go as int8 blocks for
/// the output projection (launch_merge writes them in its own kernel);
/// returns true if they were written, false to have the projection
/// quantise out itself (prefill, say).
using LayerAttention = std::function<bool(int layer, int T, const float* q, const float* k, const float* v,
                                          float* out, cuda::Int8Blocks out_int8)>;

class GpuForward {
 public:
  /// Rows a projection runs as a matvec (batched decode); more rows use the GEMM.
  static constexpr int kMatvecRows = 8;

  /// Device bytes the buffers take per row of max_rows (activations, FFN,
  /// logits, the GEMM's bf16 input).
  static size_t row_bytes(const model::ModelConfig& c);

  /// Buffers for up to `max_rows` rows. `f32_activations`: every projection
  /// multiplies dequantised weights by fp32 activations
  /// (launch_matvec_f32_activations), no int8 or bf16 rounding of them.
  /// `observer` (tests; may be empty): sees the stages of model::Stage as the
  /// CPU forward reports them, copied to the host -- each one synchronises
  /// the stream, so it cannot run inside a CUDA graph capture.
  /// Throws CudaError when the buffers do not fit (having freed what it took).
  GpuForward(const model::ModelConfig& c, const GpuWeights& w, int max_rows, bool f32_activations = false,
             model::StageObserver observer = {});
  ~GpuForward();
  GpuForward(const GpuForward&) = delete;
  GpuForward& operator=(const GpuForward&) = delete;

  /// Runs T rows (1 <= T <= max_rows): token ids `ids` (device int32 [T]) at
  /// positions `pos` (device int64 [T]; consecutive in prefill, each row its
  /// own sequence's in a batched decode: RoPE reads pos[t] per row), every
  /// layer, then the head for the last row, or for every row if all_logits.
  /// Rows never mix: each row's output depends on that row's input and its
  /// attention only. The logits go to rows [logits_row, ...) of logits():
  /// a lookahead decode step writes row 1 while its predecessor's row 0 is
  /// still wanted (gpu_sequence.cpp). Enqueued on `stream`. Throws
  /// InvalidArgument for a bad T, or logits rows past max_rows.
  void run(const int32_t* ids, const int64_t* pos, int T, const LayerAttention& attend, bool all_logits,
           cudaStream_t stream, int logits_row = 0);

  /// The phases of run(), for a tensor-parallel coordinator
  /// (tensor_parallel.h) that all-reduces between them over every shard.
  /// On a shard's config (model::shard_config) and weights, a phase computes
  /// the shard's heads and FFN rows; the two row-parallel products of a
  /// layer go to partial() instead of the residual stream:
  ///   check_run(T, all_logits, logits_row)   the checks of run(), throws as it
  ///   embed(ids, T)                          x = the rows' embeddings (whole table)
  ///   per layer l:
  ///     attention_partial(l, ...)  partial() = Wo a (this shard's heads)
  ///     [all-reduce partial() over the shards]
  ///     add_partial(l, false, T)   x += partial() (gemma3: RMSNorm(partial) * post-norm)
  ///     ffn_partial(l, T)          partial() = W_down act(...) (this shard's FFN rows)
  ///     [all-reduce]
  ///     add_partial(l, true, T)
  ///   head(T, all_logits, logits_row)        logits of this shard's vocabulary rows
  /// With the whole model (no split) this sequence is run() but for the
  /// fused residual adds, so run() stays the single-GPU path.
  void check_run(int T, bool all_logits, int logits_row) const;
  void embed(const int32_t* ids, int T, cudaStream_t stream);
  void attention_partial(int layer, int T, const int64_t* pos, const LayerAttention& attend, cudaStream_t stream);
  void ffn_partial(int layer, int T, cudaStream_t stream);
  void add_partial(int layer, bool after_ffn, int T, cudaStream_t stream);
  void head(int T, bool all_logits, cudaStream_t stream, int logits_row = 0);
  /// Device fp32 [max_rows][d_model]: a layer's partial sums between a
  /// *_partial phase and add_partial (the all-reduce's buffer).
  float* partial() const { return xn_; }

  /// Device fp32 logits of the runs: [max_rows][vocab]; a run's are rows
  /// [logits_row, + 1) (the last row) or [logits_row, + T) (all_logits).
  const float* logits() const { return logits_; }
  int max_rows() const { return max_rows_; }
  const model::ModelConfig& config() const { return c_; }

 private:
  void project(const cuda::DeviceMatrix& w, const float* in, int T, float* out, bool accumulate, cudaStream_t s);
  void norm_project(const float* in, const float* norm_w, int T,
                    std::initializer_list<std::pair<const cuda::DeviceMatrix*, float*>> outs, cudaStream_t s);
  void layer(int l, int T, const int64_t* pos, const LayerAttention& attend, cudaStream_t s);
  void attention_half(int l, int T, const int64_t* pos, const LayerAttention& attend, cudaStream_t s, bool to_x);
  void ffn_half(int l, int T, cudaStream_t s, bool to_x);
  void residual_add(const cuda::DeviceMatrix& w, const float* in, const float* post_norm, int T, cudaStream_t s,
                    bool in_quantized, bool to_x);
  void add_xn(const float* post_norm, int T, cudaStream_t s);
  void observe(int layer, model::Stage stage, const float* rows, int T, int width, cudaStream_t s);
  void allocate();
  void release();

  model::ModelConfig c_;
  const GpuWeights& w_;
  int max_rows_;
  bool f32_activations_;
  float *x_ = nullptr, *xn_ = nullptr, *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *att_ = nullptr;
  float *gate_ = nullptr, *up_ = nullptr, *logits_ = nullptr;
  void* matvec_ws_ = nullptr;
  std::unique_ptr<cuda::WeightGemm> gemm_;
  std::vector<std::unique_ptr<cuda::RopeFreqs>> ropes_;  // one per distinct RoPE base
  std::vector<const cuda::RopeFreqs*> layer_rope_;      // [layer] its base's frequencies
  model::StageObserver observer_;
  std::vector<float> observed_;  // host copy for the observer
};

}  // namespace activekv::runtime
