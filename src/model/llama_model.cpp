#include "activekv/model/llama_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "activekv/model/ops.h"

namespace activekv::model {

bool cpu_attention_kernels_default() {
  const char* v = std::getenv("ACTIVEKV_CPU_ATTENTION");
  const std::string s = v ? v : "";
  if (s.empty() || s == "auto") return true;
  if (s == "reference") return false;
  throw InvalidArgument("ACTIVEKV_CPU_ATTENTION=" + s + ": expected auto or reference");
}

const char* stage_name(Stage s) {
  switch (s) {
    case Stage::embedding: return "embedding";
    case Stage::queries: return "queries";
    case Stage::attention: return "attention";
    case Stage::layer_output: return "layer output";
  }
  return "?";
}

LlamaModel::LlamaModel(const gguf::File& f, ForwardOptions opt)
    : config_(ModelConfig::from_gguf(f)), w_(Weights::load(f, config_)) {
  set_options(opt);
}

void LlamaModel::set_options(const ForwardOptions& opt) {
  if (opt.prefill_chunk <= 0) {
    throw InvalidArgument(fmt::format("prefill_chunk must be positive, got {}", opt.prefill_chunk));
  }
  if (opt.attention.tile_pages <= 0) {
    throw InvalidArgument(fmt::format("tile_pages must be positive, got {}", opt.attention.tile_pages));
  }
  opt_ = opt;
}

kv::KvShape LlamaModel::kv_shape(int page_size, kv::PageFormat format) const {
  return kv::KvShape{config_.n_layers, config_.n_kv_heads, config_.head_dim, page_size, format};
}

attention::AttentionOptions layer_attention_options(const ModelConfig& c, int layer, attention::AttentionOptions base) {
  base.window = c.layer_attention[size_t(layer)].window;
  if (base.softmax_scale == 0.0f) base.softmax_scale = c.query_scale;
  return base;
}

attention::AttentionOptions LlamaModel::attention_options(int layer) const {
  return layer_attention_options(config_, layer, opt_.attention);
}

void LlamaModel::layer_forward(int l, int T, std::span<const BatchItem> items) {
  const ModelConfig& c = config_;
  const LayerWeights& L = w_.layers[size_t(l)];
  const LayerAttention& la = c.layer_attention[size_t(l)];
  const int d = c.d_model, q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
  const int64_t* pos = pos_.data();

  rms_norm(x_.data(), L.attn_norm.data(), T, d, c.rms_eps, norm_.data());
  L.wq.project(T, norm_.data(), q_.data(), scratch_);
  L.wk.project(T, norm_.data(), k_.data(), scratch_);
  L.wv.project(T, norm_.data(), v_.data(), scratch_);
  if (c.qkv_bias) {
    add_bias(q_.data(), L.bq.data(), T, q_dim);
    add_bias(k_.data(), L.bk.data(), T, kv_dim);
    add_bias(v_.data(), L.bv.data(), T, kv_dim);
  }
  if (c.qk_norm) {  // per head: rows of head_dim
    rms_norm(q_.data(), L.q_norm.data(), T * c.n_heads, c.head_dim, c.rms_eps, q_.data());
    rms_norm(k_.data(), L.k_norm.data(), T * c.n_kv_heads, c.head_dim, c.rms_eps, k_.data());
  }
  rope(q_.data(), T, c.n_heads, c.head_dim, pos, c, la.rope_base);
  rope(k_.data(), T, c.n_kv_heads, c.head_dim, pos, c, la.rope_base);

  // Each sequence writes and reads only its own pages: its rows' K/V go into
  // its page tables, its queries attend over those tables and nothing else.
  const attention::AttentionOptions aopt = attention_options(l);
  route::RoutedView exact;
  exact.config.tile_pages = opt_.attention.tile_pages;
  for (size_t i = 0; i < items.size(); ++i) {
    kv::SequenceKv& seq = *items[i].seq;
    const int r0 = row0_[i], n = int(items[i].tokens.size());
    const int64_t* ipos = pos + r0;
    seq.write(l, ipos[0], n, k_.data() + size_t(r0) * kv_dim, v_.data() + size_t(r0) * kv_dim);
    float* q = q_.data() + size_t(r0) * q_dim;
    if (opt_.on_queries) opt_.on_queries(l, n, q, ipos);
    const attention::LayerHistory history{&seq.store(), seq.page_table(l), ipos[n - 1] + 1};
    const attention::QueryRows rows{q, n, c.n_heads, ipos};
    const route::RoutedView& given = items[i].view ? *items[i].view : exact;
    // A sliding layer reads its window exact whatever the route (route::layer_route says why).
    route::RoutedView view = given;
    view.cpu_attention_kernels = opt_.cpu_attention_kernels;
    if (la.sliding() && given.config.kind != route::RouteKind::exact) view.config = route::layer_route(given.config, la.window);
    const attention::Partial out = route::attend_routed(history, l, view, rows, aopt, ws_);
    std::copy_n(out.o.data(), size_t(n) * q_dim, attn_.data() + size_t(r0) * q_dim);
  }
  // The stage observer (one sequence: the GPU comparison) sees every row's queries and attention.
  if (opt_.on_stage) {
    opt_.on_stage(l, Stage::queries, T, q_dim, q_.data());
    opt_.on_stage(l, Stage::attention, T, q_dim, attn_.data());
  }
  L.wo.project(T, attn_.data(), tmp_.data(), scratch_);
  if (c.post_norms) rms_norm(tmp_.data(), L.post_attn_norm.data(), T, d, c.rms_eps, tmp_.data());
  add_inplace(x_.data(), tmp_.data(), int64_t(T) * d);

  rms_norm(x_.data(), L.ffn_norm.data(), T, d, c.rms_eps, norm_.data());
  L.w_gate.project(T, norm_.data(), gate_.data(), scratch_);
  L.w_up.project(T, norm_.data(), up_.data(), scratch_);
  if (c.ffn_act == FfnActivation::GeluTanh) {
    geglu_tanh(gate_.data(), up_.data(), T, c.ffn_dim);
  } else {
    swiglu(gate_.data(), up_.data(), T, c.ffn_dim);
  }
  L.w_down.project(T, gate_.data(), tmp_.data(), scratch_);
  if (c.post_norms) rms_norm(tmp_.data(), L.post_ffn_norm.data(), T, d, c.rms_eps, tmp_.data());
  add_inplace(x_.data(), tmp_.data(), int64_t(T) * d);
  if (opt_.on_stage) opt_.on_stage(l, Stage::layer_output, T, d, x_.data());
}

int LlamaModel::prepare_rows(std::span<const BatchItem> items, size_t logits_size, bool all_logits) {
  const ModelConfig& c = config_;
  if (items.empty()) throw InvalidArgument("forward: no tokens");
  int T = 0;
  row0_.resize(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const BatchItem& it = items[i];
    if (it.tokens.empty()) throw InvalidArgument("forward: no tokens");
    if (!it.seq) throw InvalidArgument(fmt::format("forward_batch: item {} has no sequence", i));
    for (size_t j = 0; j < i; ++j) {
      if (items[j].seq == it.seq) throw InvalidArgument(fmt::format("forward_batch: items {} and {} share a sequence", j, i));
    }
    for (int32_t id : it.tokens) {
      if (id < 0 || id >= c.vocab_size) {
        throw InvalidArgument(fmt::format("forward: token id {} outside vocabulary of {}", id, c.vocab_size));
      }
    }
    row0_[i] = T;
    T += int(it.tokens.size());
  }
  const size_t need = size_t(all_logits ? T : int(items.size())) * size_t(c.vocab_size);
  if (logits_size < need) {
    throw InvalidArgument(fmt::format("forward: logits buffer holds {} floats, {} needed", logits_size, need));
  }
  const int d = c.d_model;
  x_.resize(size_t(T) * d);
  norm_.resize(size_t(T) * d);
  tmp_.resize(size_t(T) * d);
  q_.resize(size_t(T) * c.n_heads * c.head_dim);
  attn_.resize(size_t(T) * c.n_heads * c.head_dim);
  k_.resize(size_t(T) * c.n_kv_heads * c.head_dim);
  v_.resize(size_t(T) * c.n_kv_heads * c.head_dim);
  gate_.resize(size_t(T) * c.ffn_dim);
  up_.resize(size_t(T) * c.ffn_dim);
  pos_.resize(size_t(T));
  for (size_t i = 0; i < items.size(); ++i) {
    const int64_t start = items[i].seq->n_tokens();
    for (size_t t = 0; t < items[i].tokens.size(); ++t) {
      const size_t row = size_t(row0_[i]) + t;
      pos_[row] = start + int64_t(t);
      w_.token_embd.row(items[i].tokens[t], x_.data() + row * d);
    }
  }
  if (c.embed_scale != 1.0f) scale_inplace(x_.data(), c.embed_scale, int64_t(T) * d);
  if (opt_.on_stage) opt_.on_stage(-1, Stage::embedding, T, d, x_.data());
  return T;
}

void LlamaModel::run_rows(std::span<const BatchItem> items, int T) {
  for (const BatchItem& it : items) it.seq->reserve(int64_t(it.tokens.size()));  // may throw (store full): nothing written yet
  for (int l = 0; l < config_.n_layers; ++l) layer_forward(l, T, items);
  for (const BatchItem& it : items) it.seq->commit(int64_t(it.tokens.size()));
}

void LlamaModel::forward(std::span<const int32_t> tokens, kv::SequenceKv& seq,
                         std::span<float> logits, bool all_logits, const route::RoutedView* view) {
  const BatchItem item{tokens, &seq, view};
  const std::span<const BatchItem> items(&item, 1);
  const int T = prepare_rows(items, logits.size(), all_logits);
  run_rows(items, T);
  const ModelConfig& c = config_;
  const int d = c.d_model;
  const int first = all_logits ? 0 : T - 1;
  const int rows = T - first;
  rms_norm(x_.data() + size_t(first) * d, w_.output_norm.data(), rows, d, c.rms_eps, norm_.data());
  w_.head().project(rows, norm_.data(), logits.data(), scratch_);
}

void LlamaModel::forward_batch(std::span<const BatchItem> items, std::span<float> logits) {
  const int T = prepare_rows(items, logits.size(), false);
  run_rows(items, T);
  const ModelConfig& c = config_;
  const int d = c.d_model, B = int(items.size());
  for (int i = 0; i < B; ++i) {  // each item's last row
    const size_t last = size_t(row0_[size_t(i)]) + items[size_t(i)].tokens.size() - 1;
    rms_norm(x_.data() + last * d, w_.output_norm.data(), 1, d, c.rms_eps, norm_.data() + size_t(i) * d);
  }
  w_.head().project(B, norm_.data(), logits.data(), scratch_);
}

std::vector<float> LlamaModel::prefill(std::span<const int32_t> tokens, kv::SequenceKv& seq,
                                       const ProgressFn& progress, const route::RoutedView* view) {
  std::vector<float> logits(size_t(config_.vocab_size));
  const int64_t n = int64_t(tokens.size());
  for (int64_t done = 0; done < n;) {
    const int64_t len = std::min<int64_t>(opt_.prefill_chunk, n - done);
    forward(tokens.subspan(size_t(done), size_t(len)), seq, logits, false, view);
    if (view && view->compressed) view->compressed->schedule();
    done += len;
    if (progress) progress(done, n);
  }
  return logits;
}

}  // namespace activekv::model
