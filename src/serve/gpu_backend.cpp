// The GPU runtime behind the scheduler (backend.h), CUDA builds: one
// runtime::GpuModel (the weights once), a runtime::GpuSequence per request
// (its own page store, device pages within its share of the GPU budget,
// route, engine and sampler), decode steps of up to 8 requests in one forward
// pass (GpuModel::decode_batch: the weights read once per step for all;
// attention one launch per layer over all requests' page tables, each
// request reading only its own pages).
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <vector>

#include "activekv/cuda/quant_matvec.h"
#include "activekv/route/placement.h"
#include "activekv/runtime/gpu_model.h"
#include "activekv/runtime/gpu_sequence.h"
#include "backend.h"
#include "memory.h"

namespace activekv::serve {
namespace {

class GpuBackendSession final : public Session {
 public:
  GpuBackendSession(runtime::GpuModel& m, const runtime::RuntimeOptions& o) : seq_(m, o) {}
  void prefill(std::span<const int32_t> piece, bool last) override {
    if (last) {
      next_ = seq_.prefill(piece);  // samples the first token
    } else {
      seq_.append(piece);  // no sampling: the sampler draws as for a prompt in one piece
    }
  }
  int32_t sample() override { return next_; }  // the GPU sampled it with the step
  void step(int32_t token) override { next_ = seq_.decode(token); }
  void wait_conversions() override { seq_.wait_conversions(); }
  uint64_t take_bytes_read() override {
    const double now = seq_.stats().pages.bytes;  // decode steps only (prefill reads no route)
    const uint64_t b = uint64_t(now - taken_);
    taken_ = now;
    return b;
  }
  uint64_t gpu_bytes() const override { return seq_.kv_reserved(); }
  runtime::GpuSequence& seq() { return seq_; }
  void set_next(int32_t t) { next_ = t; }

 private:
  runtime::GpuSequence seq_;
  int32_t next_ = -1;
  double taken_ = 0;  // stats().pages.bytes at the last take
};

class GpuBackend final : public Backend {
 public:
  GpuBackend(const gguf::File& file, const BackendOptions& o) : o_(o), c_(model::ModelConfig::from_gguf(file)) {
    if (o.history.kv_format == "f32")
      throw Error("--kv-format f32 is the CPU path's reference format; on the GPU use bf16, lossless13, int8s or hybrid");
    base_.page_size = o.history.page_size;
    base_.route.kind = o.history.kv_format == "bf16" ? route::RouteKind::exact : route::parse_kind(o.history.kv_format);
    base_.route.recent_pages = o.history.recent_pages;
    base_.route.tile_pages = o.history.tile_pages;
    base_.placement = route::parse_placement(o.kv_placement);
    base_.convert_threads = o.history.convert_threads;
    base_.prefill_chunk = o.prefill_chunk;
    runtime::ModelOptions mo;
    mo.max_rows = o.prefill_chunk;
    mo.gpu_kv_mem = o.gpu_kv_mem;
    model_ = std::make_unique<runtime::GpuModel>(file, c_, mo);
    // Equal shares: max_seqs requests always fit the GPU budget together.
    base_.gpu_kv_mem = model_->kv_budget() / uint64_t(std::max(1, o.max_seqs));
    if (base_.gpu_kv_mem == 0) throw Error("serve --device cuda: no GPU memory left for the histories");
  }
  const model::ModelConfig& config() const override { return c_; }
  std::string describe() const override {
    return fmt::format("cuda ({}), {} route, --kv-placement {}, GPU KV budget {} ({} per request)", model_->device_name(),
                       route::kind_name(base_.route.kind), o_.kv_placement, cli::describe_bytes(model_->kv_budget()),
                       cli::describe_bytes(base_.gpu_kv_mem));
  }
  int prefill_chunk() const override { return base_.prefill_chunk; }
  int max_batch() const override { return cuda::kMaxMatvecVectors; }
  uint64_t history_bytes(int64_t n_ctx) const override {
    // The pinned bf16 page store of the global layers, and room for the
    // route's encoded copy of every page (published as pages fill).
    const kv::KvShape shape{c_.n_global_layers(), c_.n_kv_heads, c_.head_dim, base_.page_size, kv::PageFormat::bf16};
    return cli::routed_history_bytes(shape, base_.route.kind, n_ctx);
  }
  std::unique_ptr<Session> open(int64_t n_ctx, const model::SamplerParams& sampling) override {
    runtime::RuntimeOptions ro = base_;
    ro.n_ctx = n_ctx;
    ro.sampling = sampling;
    return std::make_unique<GpuBackendSession>(*model_, ro);
  }
  void step_batch(std::span<Session* const> sessions, std::span<const int32_t> tokens) override {
    std::vector<GpuBackendSession*> s;
    std::vector<runtime::GpuSequence*> seqs;
    for (Session* x : sessions) {
      s.push_back(static_cast<GpuBackendSession*>(x));
      seqs.push_back(&s.back()->seq());
    }
    const std::vector<int32_t> next = model_->decode_batch(seqs, tokens);
    for (size_t i = 0; i < s.size(); ++i) s[i]->set_next(next[i]);
  }
  std::string broken() override {
    if (!model_->broken().empty()) return model_->broken();
    // A sticky error (an illegal address, say) fails every later CUDA call of
    // the context; an ordinary one (out of memory) is cleared by reading it.
    // So: synchronise, clear, synchronise again.
    if (cudaDeviceSynchronize() == cudaSuccess) return "";
    (void)cudaGetLastError();
    const cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) return "";
    return fmt::format("the GPU's CUDA context is lost ({}: {}): no CUDA call can succeed in this process any more",
                       cudaGetErrorName(e), cudaGetErrorString(e));
  }

 private:
  BackendOptions o_;
  model::ModelConfig c_;
  runtime::RuntimeOptions base_;  // every request's, but n_ctx and sampling
  std::unique_ptr<runtime::GpuModel> model_;
};

}  // namespace

std::unique_ptr<Backend> make_gpu_backend(const gguf::File& file, const BackendOptions& o) {
  return std::make_unique<GpuBackend>(file, o);
}

}  // namespace activekv::serve
