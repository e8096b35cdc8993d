// `activekv bench --parallel --device cuda` (bench_parallel.h): one
// runtime::GpuModel for the whole run (the weights once), and per group N
// runtime::GpuSequences against it, each with its own GPU budget, advanced
// together by GpuModel::decode_batch. The public runtime API only.
#include <fmt/format.h>

#include <memory>

#include "activekv/cuda/quant_matvec.h"
#include "activekv/runtime/gpu_model.h"
#include "activekv/runtime/gpu_sequence.h"
#include "bench_parallel.h"
#include "generate.h"

namespace activekv::cli {
namespace {

class GpuGroup final : public ParallelGroup {
 public:
  GpuGroup(std::shared_ptr<runtime::GpuModel> m, const runtime::RuntimeOptions& o, int n) : model_(std::move(m)) {
    for (int s = 0; s < n; ++s) seqs_.push_back(std::make_unique<runtime::GpuSequence>(*model_, o));
    plan_ = placement_line(seqs_[0]->stats(), o.cpu_share);
  }
  ~GpuGroup() override { seqs_.clear(); }  // before the model (held here too): a sequence must not outlive it
  int size() const override { return int(seqs_.size()); }
  int max_batch() const override { return cuda::kMaxMatvecVectors; }
  int64_t n_tokens(int s) const override { return seqs_[size_t(s)]->n_tokens(); }
  int32_t prefill(int s, std::span<const int32_t> tokens) override { return seqs_[size_t(s)]->prefill(tokens); }
  std::vector<int32_t> decode_batch(std::span<const int> seqs, std::span<const int32_t> tokens) override {
    batch_.clear();
    for (int s : seqs) batch_.push_back(seqs_[size_t(s)].get());
    return model_->decode_batch(batch_, tokens);
  }
  void wait_conversions() override {
    for (auto& s : seqs_) s->wait_conversions();
  }
  double history_bytes() const override {  // as GpuSession's (bench_model_gpu.cpp), summed
    double b = 0;
    for (const auto& s : seqs_) {
      const runtime::RuntimeStats& st = s->stats();
      b += double(st.placement.placement == route::KvPlacement::gpu ? st.resident_bytes : st.streamed_bytes);
    }
    return b;
  }
  double resident_history_bytes() const override {
    double b = 0;
    for (const auto& s : seqs_)
      if (s->stats().placement.placement == route::KvPlacement::partial) b += double(s->stats().resident_bytes);
    return b;
  }
  std::vector<float> last_logits(int s) const override { return seqs_[size_t(s)]->last_logits(); }
  std::string placement() const override {
    std::string out;
    for (const auto& s : seqs_) {
      const std::string p = route::placement_name(s->stats().placement.placement);
      if (out.find(p) == std::string::npos) out += (out.empty() ? "" : "/") + p;
    }
    return out;
  }
  std::string plan() const override { return plan_; }

 private:
  std::shared_ptr<runtime::GpuModel> model_;
  std::vector<std::unique_ptr<runtime::GpuSequence>> seqs_;
  std::vector<runtime::GpuSequence*> batch_;
  std::string plan_;
};

}  // namespace

void add_gpu_parallel(BenchDevice& d, const ModelBenchArgs& a, const gguf::File& f, const model::ModelConfig& c) {
  runtime::ModelOptions mo;
  mo.max_rows = a.prefill_chunk;
  mo.gpu_kv_mem = size_t(a.gpu_kv_mem_gib * double(1ull << 30));
  auto model = std::make_shared<runtime::GpuModel>(f, c, mo);
  d.kv_budget = model->kv_budget();
  // As gpu_bench_device's; greedy, so a sequence's tokens are those it would decode alone. The GPU
  // budget is the model's (mo), split per sequence by the caller; graphs are refused with --parallel.
  GenerateArgs g = bench_generate_args(a);
  g.gpu_kv_mem_gib = 0;
  d.open_parallel = [model, g](const std::string& format, const std::string& placement, int n, int64_t n_ctx,
                               uint64_t seq_budget) {
    GenerateArgs o = g;
    o.kv_format = format;
    o.kv_placement = placement;
    runtime::RuntimeOptions ro = runtime_options(o, n_ctx);
    ro.gpu_kv_mem = size_t(seq_budget);  // explicit: a sequence asking 0 would take all the model has left
    return std::unique_ptr<ParallelGroup>(std::make_unique<GpuGroup>(model, ro, n));
  };
}

}  // namespace activekv::cli
