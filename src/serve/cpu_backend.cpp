// The CPU path behind the scheduler (backend.h): one LlamaModel, a
// cli::CpuSession per request (what `generate --device cpu` runs), batched
// steps through CpuSession::step_batch (the projections and FFN over all
// rows at once, attention per request over its own pages), and a tick's
// prompt pieces of several requests in one pass (CpuSession::append_batch).
#include <fmt/format.h>

#include <vector>

#include "activekv/route/route.h"
#include "backend.h"
#include "cpu_session.h"
#include "memory.h"

namespace activekv::serve {
namespace {

class CpuBackendSession final : public Session {
 public:
  CpuBackendSession(model::LlamaModel& lm, const cli::CpuHistoryOptions& o, int64_t n_ctx,
                    const model::SamplerParams& sampling)
      : s_(lm, o, n_ctx, sampling) {}
  void prefill(std::span<const int32_t> piece, bool last) override {
    s_.prefill(piece);
    if (last) count_decode_reads();
  }
  /// From the prompt's last piece on, what the history reads is counted (decode steps only).
  void count_decode_reads() { s_.history().view().report = &read_; }
  int32_t sample() override { return s_.sample(); }
  void step(int32_t token) override { s_.step(token); }
  void wait_conversions() override { s_.wait_conversions(); }
  uint64_t take_bytes_read() override {
    const uint64_t b = uint64_t(read_.bytes);
    read_ = {};
    return b;
  }
  cli::CpuSession& session() { return s_; }

 private:
  cli::CpuSession s_;
  route::RouteReport read_;  // what its decode steps read since the last take
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(const gguf::File& file, const std::string& model_path, const BackendOptions& o) : o_(o) {
    model::ForwardOptions fopt;
    fopt.prefill_chunk = o.prefill_chunk;
    fopt.attention.tile_pages = o.history.tile_pages;
    lm_ = cli::load_weights_checked(file, model_path, [&] { return std::make_unique<model::LlamaModel>(file, fopt); });
  }
  const model::ModelConfig& config() const override { return lm_->config(); }
  std::string describe() const override { return fmt::format("cpu, {} history", o_.history.kv_format); }
  int prefill_chunk() const override { return lm_->options().prefill_chunk; }
  bool batches_prefill() const override { return true; }
  void prefill_batch(std::span<const PrefillPiece> pieces) override {
    std::vector<cli::CpuSession*> s;
    std::vector<std::span<const int32_t>> tokens;
    for (const PrefillPiece& p : pieces) {
      s.push_back(&static_cast<CpuBackendSession*>(p.session)->session());
      tokens.push_back(p.tokens);
    }
    cli::CpuSession::append_batch(*lm_, s, tokens);
    for (const PrefillPiece& p : pieces)
      if (p.last) static_cast<CpuBackendSession*>(p.session)->count_decode_reads();
  }
  int max_batch() const override { return 1 << 20; }  // forward_batch takes any number of rows
  uint64_t history_bytes(int64_t n_ctx) const override {
    const cli::HistoryPlan plan = cli::plan_history(o_.history.kv_format);
    return cli::page_store_bytes(lm_->kv_shape(o_.history.page_size, plan.page_format), n_ctx);
  }
  std::unique_ptr<Session> open(int64_t n_ctx, const model::SamplerParams& sampling) override {
    return std::make_unique<CpuBackendSession>(*lm_, o_.history, n_ctx, sampling);
  }
  void step_batch(std::span<Session* const> sessions, std::span<const int32_t> tokens) override {
    std::vector<cli::CpuSession*> s;
    for (Session* x : sessions) s.push_back(&static_cast<CpuBackendSession*>(x)->session());
    cli::CpuSession::step_batch(*lm_, s, tokens);
  }

 private:
  BackendOptions o_;
  std::unique_ptr<model::LlamaModel> lm_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const gguf::File& file, const std::string& model_path,
                                          const BackendOptions& o) {
  return std::make_unique<CpuBackend>(file, model_path, o);
}

std::unique_ptr<Backend> make_backend(const gguf::File& file, const std::string& model_path, const BackendOptions& o) {
  if (o.device == "cpu") return make_cpu_backend(file, model_path, o);
  if (o.device != "cuda") throw Error(fmt::format("serve: unknown device '{}' (cpu or cuda)", o.device));
#ifdef ACTIVEKV_SERVE_GPU
  return make_gpu_backend(file, o);
#else
  throw Error("serve --device cuda: this activekv was built without the GPU runtime (CUDA); use --device cpu");
#endif
}

}  // namespace activekv::serve
