// The GPU runtime. See include/activekv/runtime/gpu_runtime.h.
#include "activekv/runtime/gpu_runtime.h"

#include "activekv/runtime/gpu_model.h"
#include "activekv/runtime/gpu_sequence.h"
#include "sequence_setup.h"

namespace activekv::runtime {
namespace {

// The model's half of the options: the device, the forward's arithmetic and
// its first buffer size, and a budget that is this one sequence's.
ModelOptions model_options(const RuntimeOptions& o) {
  ModelOptions m;
  m.device = o.device;
  m.max_rows = o.prefill_chunk;
  m.gpu_kv_mem = o.gpu_kv_mem;
  m.f32_activations = o.f32_activations;
  m.observer = o.observer;
  return m;
}

RuntimeOptions sequence_options(RuntimeOptions o) {
  o.observer = {};  // the model's
  return o;
}

}  // namespace

GpuRuntime::GpuRuntime(const gguf::File& f, const model::ModelConfig& c, const RuntimeOptions& opt) {
  check_sequence_options(opt, bool(opt.observer));  // before the weights load
  model_ = std::make_unique<GpuModel>(f, c, model_options(opt));
  seq_ = std::make_unique<GpuSequence>(*model_, sequence_options(opt));
}

GpuRuntime::~GpuRuntime() {
  seq_.reset();  // before the model it runs on
  model_.reset();
}

int32_t GpuRuntime::prefill(std::span<const int32_t> prompt, const ProgressFn& progress) {
  return seq_->prefill(prompt, progress);
}
int32_t GpuRuntime::decode(int32_t token) { return seq_->decode(token); }
std::vector<float> GpuRuntime::prefill_logits(std::span<const int32_t> tokens) { return seq_->prefill_logits(tokens); }
std::vector<float> GpuRuntime::last_logits() const { return seq_->last_logits(); }
void GpuRuntime::wait_conversions() { seq_->wait_conversions(); }
int64_t GpuRuntime::n_tokens() const { return seq_->n_tokens(); }
HostHistory GpuRuntime::host_history() const { return seq_->host_history(); }
const model::ModelConfig& GpuRuntime::config() const { return seq_->config(); }
const RuntimeStats& GpuRuntime::stats() const { return seq_->stats(); }

}  // namespace activekv::runtime
