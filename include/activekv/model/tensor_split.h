// Which part of each weight tensor a GPU holds when the model runs tensor
// parallel over N GPUs (issue 15 part 3; the design: docs/tensor-parallel.md).
//
// Megatron-style, aligned with the decode engine's head shards
// (kv::split_heads): shard d holds KV heads [h0, h0 + n) and their query
// heads [h0 g, (h0 + n) g) (g = GQA group), so it computes the queries, keys
// and values of exactly the heads it attends. Per layer:
//   attn_q, attn_k, attn_v (and their biases)  rows of its heads (column-parallel)
//   attn_output                                 input columns of its query heads (row-parallel: a partial sum)
//   ffn_gate, ffn_up                            rows [f0, f0 + F_d) (column-parallel)
//   ffn_down                                    input columns [f0, f0 + F_d) (row-parallel: a partial sum)
//   norms, q/k norms, token embedding           whole (replicated)
//   output head                                 rows of its vocabulary slice
// The two row-parallel products per layer are what the all-reduces sum.
//
// A column cut of a quantised matrix must fall on its blocks (32 values for
// Q4_0/Q8_0, 256 for K-quants), and of any matrix on 32 values (the GPU
// matvec's activation blocks; a float type's block is one value): the FFN
// is split in whole blocks of ffn_down's type (at least 32 values), and a
// head range whose columns do not fall on attn_output's blocks is refused
// with the tensor's name. Host code, no GPU: the plan GpuWeights and
// TensorParallelForward (activekv/runtime/tensor_parallel.h) load by.
#pragma once

#include <cstdint>
#include <vector>

#include "activekv/kv/head_shard.h"
#include "activekv/model/config.h"
#include "activekv/model/tensors.h"

namespace activekv::model {

/// How a shard holds one tensor. Rows are GGUF rows (dims[1], the output
/// side); columns are the elements of a row (dims[0], the input side).
struct TensorSlice {
  enum class Cut : uint8_t { whole, rows, cols };
  Cut cut = Cut::whole;
  int64_t begin = 0;   ///< first row (rows) or column (cols); 0 for whole
  int64_t count = 0;   ///< rows or columns held; all rows for whole
  uint64_t bytes = 0;  ///< bytes of the tensor this shard holds

  /// Where those bytes lie in the tensor's data: `count` runs of
  /// `run_bytes`, `stride` apart, the first at `offset` -- one run for whole
  /// and rows, one per row for cols (the row's blocks of the held columns,
  /// which the plan keeps on block boundaries). What a sliced upload copies.
  struct Runs {
    uint64_t offset = 0, run_bytes = 0, stride = 0;
    int64_t count = 0;
  };
  Runs runs(const gguf::TensorInfo& t) const;
  /// Rows and columns of the held part as a matrix of t's type (a vector:
  /// 1 row of `count` elements, or all of it when whole).
  int64_t held_rows(const gguf::TensorInfo& t) const;
  int64_t held_cols(const gguf::TensorInfo& t) const;
};

/// One shard's share of the model.
struct ShardSplit {
  kv::HeadRange kv_heads;   ///< its KV heads (kv::split_heads)
  int q_head0 = 0;          ///< first query head: kv_heads.head0 * group
  int q_heads = 0;          ///< kv_heads.heads * group
  int64_t ffn0 = 0;         ///< first FFN row
  int64_t ffn_rows = 0;     ///< FFN rows held (a multiple of ffn_down's block elements)
  int64_t vocab0 = 0;       ///< first row of the output head
  int64_t vocab_rows = 0;   ///< rows of the output head held
  uint64_t weight_bytes = 0;  ///< every tensor's bytes this shard holds (replicated ones whole; a tied head's slice too)
};

/// The model as one shard runs it: its query and KV heads (n_heads = q_heads,
/// n_kv_heads = kv_heads.heads), its FFN rows (ffn_dim = ffn_rows) and its
/// rows of the output head (vocab_size = vocab_rows); everything else --
/// d_model, head_dim, the softmax scale, RoPE, norms, layers -- as `c`. A
/// GPU forward pass built on it computes the shard's heads and FFN rows, and
/// its attn_output and ffn_down products are partial sums of d_model values
/// (the all-reduces'). The token embedding stays whole: a shard looks up any
/// token, so check token ids against c.vocab_size, not this.
ModelConfig shard_config(const ModelConfig& c, const ShardSplit& s);

/// The split of one model over n_shards GPUs.
struct TensorSplitPlan {
  int n_shards = 0;
  int group = 0;                  ///< query heads per KV head
  int64_t ffn_block = 0;          ///< the FFN's split unit: the largest block of any layer's ffn_down
  std::vector<ShardSplit> shards;

  /// What shard `d` holds of tensor `t` (one of `tensors`' pointers; a
  /// tensor of no role in the split -- norms, embedding -- is whole).
  /// Throws InvalidArgument for a shard out of range or a tensor not in
  /// the plan's model.
  TensorSlice slice(int d, const gguf::TensorInfo* t) const;
  /// Shard d's rows of the output head: rows [vocab0, + vocab_rows) of
  /// tensors->output, which for a tied head is the token embedding (whose
  /// slice() is whole, for the lookup: such a shard holds both).
  TensorSlice head(int d) const;
  /// Bytes one decode step reads on shard d: every tensor's held part (norms
  /// and biases as stored), of the token embedding one row, and the shard's
  /// rows of the head (tied or not). With one shard: the whole model's
  /// decode read (the figure `activekv bench` prices its floor with).
  uint64_t decode_bytes(int d) const;

  // The model's tensors the plan was made for (pointers into its gguf::File).
  const ModelTensors* tensors = nullptr;
  const ModelConfig* config = nullptr;
};

/// Plans the split of `c` (its tensors `t`, found by ModelTensors::find)
/// over n_shards GPUs. The plan keeps pointers to `c` and `t`: they must
/// outlive it. Throws InvalidArgument, one line, for: n_shards < 1 or more
/// shards than KV heads ("tensor parallel: 5 GPUs for 4 KV heads"); an FFN
/// width that is not a whole number of ffn_down blocks or has fewer blocks
/// than shards; a head range whose attn_output columns do not fall on its
/// blocks, naming the tensor, its type and the column
/// ("tensor parallel over 3 GPUs: blk.0.attn_output.weight (Q4_K, blocks of
/// 256 values) would be cut at column 384 (query head 6 of 64 channels)").
TensorSplitPlan plan_tensor_split(const ModelConfig& c, const ModelTensors& t, int n_shards);

}  // namespace activekv::model
