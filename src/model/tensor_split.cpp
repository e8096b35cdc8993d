#include "activekv/model/tensor_split.h"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>
#include <utility>

#include "activekv/core/error.h"

namespace activekv::model {
namespace {

enum class Role { whole, q, kv, o, ffn_in, ffn_out, head };

// The smallest unit a column cut may take, whatever the type: the GPU
// matvec quantises its input in 32-value blocks (a float matrix's "block" is
// one value, which would allow cuts the kernels cannot take).
constexpr int64_t kMinCutColumns = 32;

/// Rows of a GGUF tensor (1 for a vector).
int64_t rows_of(const gguf::TensorInfo& t) { return t.dims.size() > 1 ? int64_t(t.dims[1]) : 1; }

Role role_of(const ModelTensors& m, const gguf::TensorInfo* t, bool& found) {
  found = true;
  if (t == m.output && m.output != m.token_embd) return Role::head;
  if (t == m.token_embd || t == m.output_norm) return Role::whole;
  for (const LayerTensors& L : m.layers) {
    if (t == L.wq || t == L.bq) return Role::q;
    if (t == L.wk || t == L.wv || t == L.bk || t == L.bv) return Role::kv;
    if (t == L.wo) return Role::o;
    if (t == L.w_gate || t == L.w_up) return Role::ffn_in;
    if (t == L.w_down) return Role::ffn_out;
    for (const gguf::TensorInfo* w : {L.attn_norm, L.ffn_norm, L.q_norm, L.k_norm, L.post_attn_norm, L.post_ffn_norm})
      if (t == w) return Role::whole;
  }
  found = false;
  return Role::whole;
}

/// A vector (biases) is cut along its elements, a matrix along `matrix_cut`.
TensorSlice cut(const gguf::TensorInfo& t, TensorSlice::Cut matrix_cut, int64_t begin, int64_t count) {
  TensorSlice s;
  s.cut = t.dims.size() > 1 ? matrix_cut : TensorSlice::Cut::cols;
  s.begin = begin;
  s.count = count;
  s.bytes = s.cut == TensorSlice::Cut::rows ? uint64_t(count) * gguf::row_bytes(t.type, t.dims[0])
                                            : uint64_t(rows_of(t)) * gguf::row_bytes(t.type, uint64_t(count));
  return s;
}

/// Splits `units` over n shards: the first units % n get one more.
std::pair<int64_t, int64_t> even_share(int64_t units, int n, int d) {
  const int64_t base = units / n, extra = units % n;
  return {d * base + std::min<int64_t>(d, extra), base + (d < extra ? 1 : 0)};
}

/// Refuses a cut of attn_output's input columns that is not on its blocks.
void check_output_columns(const ModelConfig& c, const ModelTensors& m, const ShardSplit& s, int n) {
  for (const LayerTensors& L : m.layers) {
    const int64_t block = std::max<int64_t>(kMinCutColumns, int64_t(gguf::block_elements(L.wo->type)));
    for (const int head : {s.q_head0, s.q_head0 + s.q_heads}) {
      const int64_t col = int64_t(head) * c.head_dim;
      if (col % block != 0)
        throw InvalidArgument(fmt::format(
            "tensor parallel over {} GPUs: {} ({}, blocks of {} values) would be cut at column {} (query head {} "
            "of {} channels)",
            n, L.wo->name, gguf::type_name(L.wo->type), block, col, head, c.head_dim));
    }
  }
}

}  // namespace

TensorSlice::Runs TensorSlice::runs(const gguf::TensorInfo& t) const {
  const uint64_t row = gguf::row_bytes(t.type, t.dims[0]);
  switch (cut) {
    case Cut::whole: return {0, t.n_bytes, t.n_bytes, 1};
    case Cut::rows: return {uint64_t(begin) * row, uint64_t(count) * row, uint64_t(count) * row, 1};
    case Cut::cols: break;
  }
  const uint64_t per_block = gguf::block_bytes(t.type), elems = gguf::block_elements(t.type);
  return {uint64_t(begin) / elems * per_block, uint64_t(count) / elems * per_block, row, rows_of(t)};
}

TensorSlice TensorSplitPlan::slice(int d, const gguf::TensorInfo* t) const {
  if (d < 0 || d >= n_shards)
    throw InvalidArgument(fmt::format("tensor split: shard {} of {}", d, n_shards));
  bool found = false;
  const Role role = t ? role_of(*tensors, t, found) : Role::whole;
  if (!found) throw InvalidArgument("tensor split: a tensor not of the planned model");
  const ShardSplit& s = shards[size_t(d)];
  const int64_t hd = config->head_dim;
  using Cut = TensorSlice::Cut;
  switch (role) {
    case Role::q: return cut(*t, Cut::rows, s.q_head0 * hd, s.q_heads * hd);
    case Role::kv: return cut(*t, Cut::rows, s.kv_heads.head0 * hd, s.kv_heads.heads * hd);
    case Role::o: return cut(*t, Cut::cols, s.q_head0 * hd, s.q_heads * hd);
    case Role::ffn_in: return cut(*t, Cut::rows, s.ffn0, s.ffn_rows);
    case Role::ffn_out: return cut(*t, Cut::cols, s.ffn0, s.ffn_rows);
    case Role::head: return cut(*t, Cut::rows, s.vocab0, s.vocab_rows);
    case Role::whole: break;
  }
  return {TensorSlice::Cut::whole, 0, rows_of(*t), t->n_bytes};
}

TensorSlice TensorSplitPlan::head(int d) const {
  if (d < 0 || d >= n_shards)
    throw InvalidArgument(fmt::format("tensor split: shard {} of {}", d, n_shards));
  const ShardSplit& s = shards[size_t(d)];
  return cut(*tensors->output, TensorSlice::Cut::rows, s.vocab0, s.vocab_rows);
}

uint64_t TensorSplitPlan::decode_bytes(int d) const {
  const ModelTensors& t = *tensors;
  const gguf::TensorInfo& embd = *t.token_embd;
  uint64_t bytes = head(d).bytes + embd.n_bytes / uint64_t(rows_of(embd));  // the head's rows; one embedding row
  std::vector<const gguf::TensorInfo*> rest{t.output_norm};
  for (const LayerTensors& L : t.layers)
    for (const gguf::TensorInfo* w : {L.attn_norm, L.wq, L.wk, L.wv, L.bq, L.bk, L.bv, L.wo, L.ffn_norm, L.w_gate,
                                      L.w_up, L.w_down, L.q_norm, L.k_norm, L.post_attn_norm, L.post_ffn_norm})
      if (w) rest.push_back(w);
  for (const gguf::TensorInfo* w : rest) bytes += slice(d, w).bytes;
  return bytes;
}

int64_t TensorSlice::held_rows(const gguf::TensorInfo& t) const { return cut == Cut::rows ? count : rows_of(t); }

int64_t TensorSlice::held_cols(const gguf::TensorInfo& t) const {
  return cut == Cut::cols ? count : int64_t(t.dims[0]);
}

ModelConfig shard_config(const ModelConfig& c, const ShardSplit& s) {
  ModelConfig local = c;
  local.n_heads = s.q_heads;
  local.n_kv_heads = s.kv_heads.heads;
  local.ffn_dim = int(s.ffn_rows);
  local.vocab_size = int(s.vocab_rows);
  return local;
}

TensorSplitPlan plan_tensor_split(const ModelConfig& c, const ModelTensors& t, int n_shards) {
  if (n_shards < 1) throw InvalidArgument(fmt::format("tensor parallel: {} GPUs", n_shards));
  if (n_shards > c.n_kv_heads)
    throw InvalidArgument(fmt::format("tensor parallel: {} GPUs for {} KV head{} (at most one GPU per KV head)",
                                      n_shards, c.n_kv_heads, c.n_kv_heads == 1 ? "" : "s"));
  if (t.layers.size() != size_t(c.n_layers))
    throw InvalidArgument(fmt::format("tensor parallel: {} layers of tensors for a {}-layer model", t.layers.size(),
                                      c.n_layers));
  TensorSplitPlan p;
  p.n_shards = n_shards;
  p.group = c.n_heads / c.n_kv_heads;
  p.tensors = &t;
  p.config = &c;
  // At least 32: the GPU matvec's unit (its int8 activation blocks, its
  // workspace), which a float ffn_down (blocks of one value) would not give.
  p.ffn_block = kMinCutColumns;
  for (const LayerTensors& L : t.layers)
    p.ffn_block = std::max<int64_t>(p.ffn_block, int64_t(gguf::block_elements(L.w_down->type)));
  if (c.ffn_dim % p.ffn_block != 0 || c.ffn_dim / p.ffn_block < n_shards)
    throw InvalidArgument(fmt::format("tensor parallel over {} GPUs: the FFN's {} rows are not {} or more whole "
                                      "blocks of {} values (ffn_down's type)",
                                      n_shards, c.ffn_dim, n_shards, p.ffn_block));
  const std::vector<kv::HeadRange> heads = kv::split_heads(c.n_kv_heads, n_shards);
  for (int d = 0; d < n_shards; ++d) {
    ShardSplit s;
    s.kv_heads = heads[size_t(d)];
    s.q_head0 = s.kv_heads.head0 * p.group;
    s.q_heads = s.kv_heads.heads * p.group;
    const auto [f0, fn] = even_share(c.ffn_dim / p.ffn_block, n_shards, d);
    s.ffn0 = f0 * p.ffn_block;
    s.ffn_rows = fn * p.ffn_block;
    std::tie(s.vocab0, s.vocab_rows) = even_share(c.vocab_size, n_shards, d);
    check_output_columns(c, t, s, n_shards);
    p.shards.push_back(s);
  }
  // Every tensor once (a tied head is the embedding, counted whole).
  std::vector<const gguf::TensorInfo*> all{t.token_embd, t.output_norm};
  if (t.output != t.token_embd) all.push_back(t.output);
  for (const LayerTensors& L : t.layers)
    for (const gguf::TensorInfo* w : {L.attn_norm, L.wq, L.wk, L.wv, L.bq, L.bk, L.bv, L.wo, L.ffn_norm, L.w_gate,
                                      L.w_up, L.w_down, L.q_norm, L.k_norm, L.post_attn_norm, L.post_ffn_norm})
      if (w) all.push_back(w);
  for (int d = 0; d < n_shards; ++d) {
    for (const gguf::TensorInfo* w : all) p.shards[size_t(d)].weight_bytes += p.slice(d, w).bytes;
    if (t.output == t.token_embd) p.shards[size_t(d)].weight_bytes += p.head(d).bytes;  // the embedding stays whole
  }
  return p;
}

}  // namespace activekv::model
