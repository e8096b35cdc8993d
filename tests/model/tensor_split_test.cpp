// The tensor-parallel split plan (activekv/model/tensor_split.h) on
// hand-made tensor lists: the 27B attention shape of SPEC §1 over 2 and 3
// GPUs, and the refusals.
#include "activekv/model/tensor_split.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <deque>
#include <random>
#include <string>

#include "activekv/core/error.h"
#include "model_fixture.h"

namespace activekv::model {
namespace {

using gguf::TensorType;

/// A model's tensors without a file: dims and bytes only.
struct FakeModel {
  ModelConfig c;
  std::deque<gguf::TensorInfo> store;  // stable addresses
  ModelTensors t;

  const gguf::TensorInfo* add(const std::string& name, TensorType type, uint64_t cols, uint64_t rows = 0) {
    gguf::TensorInfo i;
    i.name = name;
    i.type = type;
    i.dims = rows ? std::vector<uint64_t>{cols, rows} : std::vector<uint64_t>{cols};
    i.n_elements = cols * (rows ? rows : 1);
    i.n_bytes = gguf::row_bytes(type, cols) * (rows ? rows : 1);
    store.push_back(i);
    return &store.back();
  }

  FakeModel(int layers, int d_model, int n_heads, int n_kv, int head_dim, int ffn, int vocab, TensorType wtype,
            TensorType wo_type, TensorType down_type) {
    c.arch = "llama";
    c.n_layers = layers;
    c.d_model = d_model;
    c.n_heads = n_heads;
    c.n_kv_heads = n_kv;
    c.head_dim = head_dim;
    c.ffn_dim = ffn;
    c.vocab_size = vocab;
    const uint64_t qd = uint64_t(n_heads) * head_dim, kvd = uint64_t(n_kv) * head_dim;
    t.token_embd = add("token_embd.weight", wtype, d_model, vocab);
    t.output_norm = add("output_norm.weight", TensorType::F32, d_model);
    t.output = add("output.weight", wtype, d_model, vocab);
    for (int l = 0; l < layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      LayerTensors L;
      L.attn_norm = add(b + "attn_norm.weight", TensorType::F32, d_model);
      L.wq = add(b + "attn_q.weight", wtype, d_model, qd);
      L.wk = add(b + "attn_k.weight", wtype, d_model, kvd);
      L.wv = add(b + "attn_v.weight", wtype, d_model, kvd);
      L.wo = add(b + "attn_output.weight", wo_type, qd, d_model);
      L.ffn_norm = add(b + "ffn_norm.weight", TensorType::F32, d_model);
      L.w_gate = add(b + "ffn_gate.weight", wtype, d_model, ffn);
      L.w_up = add(b + "ffn_up.weight", wtype, d_model, ffn);
      L.w_down = add(b + "ffn_down.weight", down_type, ffn, d_model);
      t.layers.push_back(L);
    }
  }
};

FakeModel shape_27b(int layers = 2) {
  return FakeModel(layers, 5120, 24, 4, 256, 17408, 32000, TensorType::Q4_0, TensorType::Q4_0, TensorType::Q4_0);
}

std::string refusal(const FakeModel& m, int n) {
  try {
    plan_tensor_split(m.c, m.t, n);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TensorSplit, TwoGpusOnThe27BShape) {
  const FakeModel m = shape_27b();
  const TensorSplitPlan p = plan_tensor_split(m.c, m.t, 2);
  ASSERT_EQ(p.shards.size(), 2u);
  EXPECT_EQ(p.group, 6);
  EXPECT_EQ(p.ffn_block, 32);
  const LayerTensors& L = m.t.layers[1];
  for (int d = 0; d < 2; ++d) {
    const ShardSplit& s = p.shards[size_t(d)];
    EXPECT_EQ(s.kv_heads, (kv::HeadRange{2 * d, 2}));
    EXPECT_EQ(s.q_head0, 12 * d);
    EXPECT_EQ(s.q_heads, 12);
    EXPECT_EQ(s.ffn0, 8704 * d);
    EXPECT_EQ(s.ffn_rows, 8704);  // 272 blocks of 32
    EXPECT_EQ(s.vocab0, 16000 * d);
    EXPECT_EQ(s.vocab_rows, 16000);
    const TensorSlice q = p.slice(d, L.wq), k = p.slice(d, L.wk), o = p.slice(d, L.wo), down = p.slice(d, L.w_down);
    EXPECT_EQ(q.cut, TensorSlice::Cut::rows);
    EXPECT_EQ(q.begin, 3072 * d);
    EXPECT_EQ(q.count, 3072);
    EXPECT_EQ(k.begin, 512 * d);
    EXPECT_EQ(k.count, 512);
    EXPECT_EQ(o.cut, TensorSlice::Cut::cols);
    EXPECT_EQ(o.begin, 3072 * d);
    EXPECT_EQ(o.bytes, L.wo->n_bytes / 2);
    EXPECT_EQ(down.cut, TensorSlice::Cut::cols);
    EXPECT_EQ(down.bytes, L.w_down->n_bytes / 2);
    EXPECT_EQ(p.slice(d, L.attn_norm).cut, TensorSlice::Cut::whole);
    EXPECT_EQ(p.slice(d, m.t.token_embd).bytes, m.t.token_embd->n_bytes);  // the lookup needs every row
    EXPECT_EQ(p.slice(d, m.t.output).count, 16000);
  }
  // Every shard holds half of each cut tensor and all of the replicated ones.
  uint64_t total = 0, replicated = m.t.token_embd->n_bytes + m.t.output_norm->n_bytes;
  for (const gguf::TensorInfo& i : m.store) total += i.n_bytes;
  for (const LayerTensors& l : m.t.layers) replicated += l.attn_norm->n_bytes + l.ffn_norm->n_bytes;
  EXPECT_EQ(p.shards[0].weight_bytes + p.shards[1].weight_bytes, total + replicated);
}

TEST(TensorSplit, ThreeGpusSplitHeadsAndTheFfnUnevenlyInWholeBlocks) {
  const FakeModel m = shape_27b();
  const TensorSplitPlan p = plan_tensor_split(m.c, m.t, 3);
  const int kv[3] = {2, 1, 1};
  const int64_t ffn[3] = {5824, 5792, 5792};  // 544 blocks of 32: 182, 181, 181
  int64_t ffn0 = 0, q0 = 0;
  for (int d = 0; d < 3; ++d) {
    const ShardSplit& s = p.shards[size_t(d)];
    EXPECT_EQ(s.kv_heads.heads, kv[d]);
    EXPECT_EQ(s.q_head0, q0);
    EXPECT_EQ(s.ffn_rows, ffn[d]);
    EXPECT_EQ(s.ffn0, ffn0);
    EXPECT_EQ(s.ffn_rows % 32, 0);
    const TensorSlice o = p.slice(d, m.t.layers[0].wo);
    EXPECT_EQ(o.begin, q0 * 256);
    EXPECT_EQ(o.count, int64_t(kv[d]) * 6 * 256);
    ffn0 += ffn[d];
    q0 += kv[d] * 6;
  }
  EXPECT_EQ(ffn0, 17408);
  EXPECT_EQ(p.shards[0].vocab_rows + p.shards[1].vocab_rows + p.shards[2].vocab_rows, 32000);
}

// A K-quant ffn_down splits the FFN in its 256-value blocks.
TEST(TensorSplit, TheFfnSplitsInTheLargestDownBlock) {
  FakeModel m(2, 512, 8, 4, 64, 2816, 1000, TensorType::Q4_K, TensorType::Q4_K, TensorType::Q6_K);
  const TensorSplitPlan p = plan_tensor_split(m.c, m.t, 2);
  EXPECT_EQ(p.ffn_block, 256);
  EXPECT_EQ(p.shards[0].ffn_rows, 1536);  // 11 blocks: 6 + 5
  EXPECT_EQ(p.shards[1].ffn_rows, 1280);
}

// A float ffn_down (blocks of one value) still splits in 32-value units,
// the GPU matvec's: 8192 rows over 3 shards, not 2731/2731/2730.
TEST(TensorSplit, FloatMatricesSplitIn32ValueUnits) {
  FakeModel m(1, 512, 6, 3, 64, 8192, 1000, TensorType::F16, TensorType::F16, TensorType::BF16);
  const TensorSplitPlan p = plan_tensor_split(m.c, m.t, 3);
  EXPECT_EQ(p.ffn_block, 32);
  for (const ShardSplit& s : p.shards) EXPECT_EQ(s.ffn_rows % 32, 0) << s.ffn_rows;
  EXPECT_EQ(p.shards[0].ffn_rows + p.shards[1].ffn_rows + p.shards[2].ffn_rows, 8192);
  // Heads of 16 channels over 4 shards (2, 2, 1, 1 heads): the third shard's one head ends at column 80.
  FakeModel narrow(1, 512, 6, 6, 16, 1024, 1000, TensorType::F16, TensorType::F16, TensorType::F16);
  EXPECT_EQ(refusal(narrow, 4), "tensor parallel over 4 GPUs: blk.0.attn_output.weight (F16, blocks of 32 values) "
                                "would be cut at column 80 (query head 5 of 16 channels)");
  EXPECT_NO_THROW(plan_tensor_split(narrow.c, narrow.t, 3));  // 2 heads each: cuts at 32 and 64
}

TEST(TensorSplit, RefusesWhatCannotSplit) {
  EXPECT_EQ(refusal(shape_27b(), 5), "tensor parallel: 5 GPUs for 4 KV heads (at most one GPU per KV head)");
  EXPECT_EQ(refusal(shape_27b(), 0), "tensor parallel: 0 GPUs");
  // 6 query heads of 64 channels per shard: column 384 is inside a Q4_K block of attn_output.
  const FakeModel k(2, 768, 12, 4, 64, 1024, 1000, TensorType::Q4_K, TensorType::Q4_K, TensorType::Q4_K);
  EXPECT_EQ(refusal(k, 2), "tensor parallel over 2 GPUs: blk.0.attn_output.weight (Q4_K, blocks of 256 values) "
                           "would be cut at column 384 (query head 6 of 64 channels)");
  // An FFN of one Q4_K block cannot go to two GPUs.
  const FakeModel f(1, 512, 8, 4, 64, 256, 1000, TensorType::Q4_0, TensorType::Q4_0, TensorType::Q4_K);
  EXPECT_EQ(refusal(f, 2), "tensor parallel over 2 GPUs: the FFN's 256 rows are not 2 or more whole blocks of 256 "
                           "values (ffn_down's type)");
}

TEST(TensorSplit, SliceChecksItsArguments) {
  const FakeModel m = shape_27b();
  const FakeModel other = shape_27b();
  const TensorSplitPlan p = plan_tensor_split(m.c, m.t, 2);
  EXPECT_THROW(p.slice(2, m.t.output), InvalidArgument);
  EXPECT_THROW(p.slice(-1, m.t.output), InvalidArgument);
  EXPECT_THROW(p.slice(0, other.t.output), InvalidArgument);
  // One GPU: every tensor whole or cut to all of it.
  const TensorSplitPlan one = plan_tensor_split(m.c, m.t, 1);
  uint64_t total = 0;
  for (const gguf::TensorInfo& i : m.store) total += i.n_bytes;
  EXPECT_EQ(one.shards[0].weight_bytes, total);
}

/// y = W x for the bytes of `s` (its runs) of W, x of the held columns (or all of them for a row cut).
std::vector<float> slice_times(const gguf::TensorInfo& w, const TensorSlice& s, const std::vector<float>& x) {
  const TensorSlice::Runs r = s.runs(w);
  const int64_t cols = s.cut == TensorSlice::Cut::cols ? s.count : int64_t(w.dims[0]);
  const int64_t rows = s.cut == TensorSlice::Cut::rows ? s.count : int64_t(w.dims[1]);
  std::vector<float> row(static_cast<size_t>(cols)), y(static_cast<size_t>(rows));
  const uint64_t row_in_run = gguf::row_bytes(w.type, uint64_t(cols));
  for (int64_t i = 0; i < rows; ++i) {
    const uint64_t at = r.count > 1 ? r.offset + uint64_t(i) * r.stride : r.offset + uint64_t(i) * row_in_run;
    EXPECT_LE(at + row_in_run, w.n_bytes);
    gguf::dequantize(w.type, w.data + at, row.data(), uint64_t(cols));
    double acc = 0;
    for (int64_t j = 0; j < cols; ++j) acc += double(row[size_t(j)]) * x[size_t(s.cut == TensorSlice::Cut::cols ? s.begin + j : j)];
    y[size_t(i)] = float(acc);
  }
  return y;
}

// The default model (SmolLM2-135M, Q4_1, 3 KV heads) over 3 GPUs: the byte
// runs of each shard's slices, dequantised, give the whole product --
// concatenated for row cuts (attn_q, ffn_gate), summed for column cuts
// (attn_output, ffn_down: the all-reduce) -- within double summation order.
TEST(TensorSplit, TheSlicesOfARealModelRebuildItsProducts) {
  const gguf::File& f = testing::model_file();
  const ModelConfig c = ModelConfig::from_gguf(f);
  const ModelTensors t = ModelTensors::find(f, c);
  const TensorSplitPlan p = plan_tensor_split(c, t, 3);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (const gguf::TensorInfo* w : {t.layers[0].wq, t.layers[7].w_gate, t.layers[0].wo, t.layers[29].w_down}) {
    SCOPED_TRACE(w->name);
    std::vector<float> x(size_t(w->dims[0]));
    for (float& v : x) v = nd(rng);
    const std::vector<float> whole = slice_times(*w, {TensorSlice::Cut::whole, 0, int64_t(w->dims[1]), w->n_bytes}, x);
    std::vector<float> rebuilt;
    std::vector<double> sum(whole.size(), 0.0);
    uint64_t bytes = 0;
    for (int d = 0; d < 3; ++d) {
      const TensorSlice s = p.slice(d, w);
      bytes += s.bytes;
      const std::vector<float> part = slice_times(*w, s, x);
      if (s.cut == TensorSlice::Cut::rows) {
        rebuilt.insert(rebuilt.end(), part.begin(), part.end());
      } else {
        ASSERT_EQ(s.cut, TensorSlice::Cut::cols);
        for (size_t i = 0; i < part.size(); ++i) sum[i] += part[i];
      }
    }
    EXPECT_EQ(bytes, w->n_bytes);
    if (rebuilt.empty()) rebuilt.assign(sum.begin(), sum.end());
    ASSERT_EQ(rebuilt.size(), whole.size());
    double worst = 0, scale = 0;
    for (size_t i = 0; i < whole.size(); ++i) {
      worst = std::max(worst, std::fabs(double(rebuilt[i]) - whole[i]));
      scale = std::max(scale, double(std::fabs(whole[i])));
    }
    // Row cuts: the same rows, the same sums (measured 0). Column cuts:
    // three partial sums, each rounded to float, against one: measured at
    // most 8.7e-8 of the largest |y| (ffn_down; attn_output 2.2e-8). Bound ~3x.
    std::printf("[measured] %s: max |rebuilt - whole| %.3g of max |y| %.3g\n", w->name.c_str(), worst, scale);
    EXPECT_LE(worst, 2.6e-7 * scale) << worst << " of " << scale;
  }
}

// What a shard's forward pass is built on: its heads, FFN rows and
// vocabulary rows; and the head of a tied model (SmolLM2 ties it to the
// embedding), which each shard holds as its rows beside the whole embedding.
TEST(TensorSplit, ShardConfigsAndATiedHead) {
  const gguf::File& f = testing::model_file();
  const ModelConfig c = ModelConfig::from_gguf(f);
  const ModelTensors t = ModelTensors::find(f, c);
  ASSERT_TRUE(c.tied_output);
  ASSERT_EQ(c.n_kv_heads, 3);
  const TensorSplitPlan p = plan_tensor_split(c, t, 3);
  int heads = 0, kv = 0;
  int64_t ffn = 0, vocab = 0;
  for (int d = 0; d < 3; ++d) {
    const ModelConfig s = shard_config(c, p.shards[size_t(d)]);
    EXPECT_EQ(s.n_heads, c.n_heads / 3);
    EXPECT_EQ(s.n_kv_heads, 1);
    EXPECT_EQ(s.ffn_dim, p.shards[size_t(d)].ffn_rows);
    EXPECT_EQ(s.vocab_size, p.shards[size_t(d)].vocab_rows);
    EXPECT_EQ(s.d_model, c.d_model);
    EXPECT_EQ(s.head_dim, c.head_dim);
    EXPECT_EQ(s.query_scale, c.query_scale);  // 1/sqrt(head_dim), not of the shard's width
    EXPECT_EQ(s.n_layers, c.n_layers);
    heads += s.n_heads;
    kv += s.n_kv_heads;
    ffn += s.ffn_dim;
    vocab += s.vocab_size;
    const TensorSlice head = p.head(d);
    EXPECT_EQ(head.cut, TensorSlice::Cut::rows);
    EXPECT_EQ(head.begin, p.shards[size_t(d)].vocab0);
    EXPECT_EQ(head.held_rows(*t.token_embd), p.shards[size_t(d)].vocab_rows);
    EXPECT_EQ(head.held_cols(*t.token_embd), c.d_model);
    EXPECT_EQ(p.slice(d, t.token_embd).cut, TensorSlice::Cut::whole);  // the lookup needs every row
    const TensorSlice o = p.slice(d, t.layers[0].wo);
    EXPECT_EQ(o.held_rows(*t.layers[0].wo), c.d_model);
    EXPECT_EQ(o.held_cols(*t.layers[0].wo), int64_t(s.n_heads) * c.head_dim);
  }
  EXPECT_EQ(heads, c.n_heads);
  EXPECT_EQ(kv, c.n_kv_heads);
  EXPECT_EQ(ffn, c.ffn_dim);
  EXPECT_EQ(vocab, c.vocab_size);
  EXPECT_THROW(p.head(3), InvalidArgument);
  // Three shards hold the whole tensors (the embedding, the norms) three
  // times, the cut ones -- the tied head's rows among them -- once.
  const TensorSplitPlan one = plan_tensor_split(c, t, 1);
  uint64_t all = 0, replicated = t.token_embd->n_bytes + t.output_norm->n_bytes;
  for (int d = 0; d < 3; ++d) all += p.shards[size_t(d)].weight_bytes;
  for (const LayerTensors& L : t.layers)
    for (const gguf::TensorInfo* w : {L.attn_norm, L.ffn_norm})
      if (w) replicated += w->n_bytes;
  EXPECT_EQ(all, one.shards[0].weight_bytes + 2 * replicated);
  // A decode step reads every tensor but the embedding (one row of it) and
  // the tied head once: with one shard, the whole model's bytes; over three,
  // the replicated vectors three times and the rest once.
  uint64_t whole = 0;
  for (const gguf::TensorInfo& i : f.tensors())
    whole += i.name == "token_embd.weight" ? i.n_bytes + i.n_bytes / i.dims[1] : i.n_bytes;
  EXPECT_EQ(one.decode_bytes(0), whole);
  const uint64_t vectors = replicated - t.token_embd->n_bytes;
  const uint64_t embd_row = t.token_embd->n_bytes / t.token_embd->dims[1];
  EXPECT_EQ(p.decode_bytes(0) + p.decode_bytes(1) + p.decode_bytes(2), whole + 2 * (vectors + embd_row));
}

}  // namespace
}  // namespace activekv::model
