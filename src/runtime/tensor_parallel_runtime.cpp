// One history decoded tensor parallel over several GPUs. See
// include/activekv/runtime/tensor_parallel_runtime.h.
#include "activekv/runtime/tensor_parallel_runtime.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>

#include "activekv/cuda/device_pages.h"
#include "activekv/route/placement.h"

#include "activekv/cuda/decode_engine.h"
#include "activekv/cuda/pinned_memory.h"
#include "activekv/cuda/prefill.h"
#include "activekv/cuda/sampling.h"
#include "activekv/kv/page_store.h"
#include "activekv/runtime/tensor_parallel.h"
#include "device_buffer.h"
#include "device_scope.h"
#include "history_view.h"
#include "sequence_setup.h"

namespace activekv::runtime {
namespace {

using cuda::DeviceScope;

// Refuses, in one line each, what this first version does not take.
void check_tensor_parallel_options(const RuntimeOptions& opt) {
  if (opt.cpu_share != 0)
    throw InvalidArgument("tensor parallel (--gpus) cannot give pages to the CPU (--cpu-share) yet");
  if (opt.observer) throw InvalidArgument("tensor parallel (--gpus) takes no stage observer");
}

}  // namespace

// What one shard holds of the history: its heads' view of the one store.
struct TpShard {
  int device = 0;
  cuda::AttnShape attn;  // the shard's heads of whole pages
  RuntimeStats stats;
  std::unique_ptr<HistoryView> history;
  std::unique_ptr<cuda::DecodeEngine> engine;
  std::unique_ptr<cuda::PrefillAttention> prefill;
  RouteCounts route;  // the step's, counted when it commits
};

struct TensorParallelRuntime::Impl {
  model::ModelConfig c;
  RuntimeOptions opt;
  std::unique_ptr<TensorParallelForward> fw;
  std::unique_ptr<kv::PageStore> store;
  std::unique_ptr<kv::SequenceKv> seq;
  std::vector<std::unique_ptr<TpShard>> shards;
  std::unique_ptr<cuda::GpuSampler> sampler;  // home device
  int rows_cap = 0;
  int32_t* ids = nullptr;       // home device [rows_cap]
  int64_t* pos = nullptr;       // home device [n_ctx]: 0, 1, 2, ...
  int32_t* sampled = nullptr;   // home device: the last sampled token
  int32_t* host_ids = nullptr;  // pinned [rows_cap + 1]: uploads, then the sampled token
  cudaEvent_t done = nullptr;   // home device: after a step's sampled token is home
  bool has_logits = false;
  int last_row = 0;

  Impl(const gguf::File& f, const model::ModelConfig& cfg, const RuntimeOptions& o, const std::vector<int>& devices);
  ~Impl();
  void release();
  void place_histories();
  void build_tables(int64_t n_tokens);
  int home() const { return fw->device(0); }
  void check_tokens(std::span<const int32_t> tokens) const;
  int32_t run_chunk(std::span<const int32_t> tokens, bool decode);
};

TensorParallelRuntime::Impl::Impl(const gguf::File& f, const model::ModelConfig& cfg, const RuntimeOptions& o,
                                  const std::vector<int>& devices)
    : c(cfg), opt(o) {
  check_sequence_options(opt, false);
  check_tensor_parallel_options(opt);
  rows_cap = opt.prefill_chunk;
  fw = std::make_unique<TensorParallelForward>(f, c, devices, rows_cap, opt.f32_activations);
  try {
    const cuda::AttnShape whole = sequence_attn_shape(c, opt);
    const kv::KvShape kv_shape{c.n_global_layers(), c.n_kv_heads, c.head_dim, opt.page_size, kv::PageFormat::bf16};
    const int64_t pages_per_layer = (opt.n_ctx + opt.page_size - 1) / opt.page_size;
    store = std::make_unique<kv::PageStore>(kv_shape, size_t(pages_per_layer) * size_t(kv_shape.n_layers),
                                            &cuda::pinned_host_memory());
    seq = std::make_unique<kv::SequenceKv>(*store);
    // What every shard needs beside its history first, so that the budgets
    // below see the memory left (as GpuSequence allocates before its HistoryView).
    for (int i = 0; i < fw->n_shards(); ++i) {
      auto s = std::make_unique<TpShard>();
      s->device = fw->device(i);
      s->attn = whole;
      s->attn.kv_head0 = fw->plan().shards[size_t(i)].kv_heads.head0;
      s->attn.n_kv_heads = fw->plan().shards[size_t(i)].kv_heads.heads;
      s->attn.page_kv_heads = whole.n_kv_heads;
      DeviceScope on(s->device);
      cudaDeviceProp prop{};
      cuda::check_cuda(cudaGetDeviceProperties(&prop, s->device), "cudaGetDeviceProperties");
      s->stats.device = prop.name;
      s->stats.weight_bytes = fw->weight_bytes(i);
      s->engine = std::make_unique<cuda::DecodeEngine>(sequence_engine_config(c, opt, s->attn, fw->stream(i)));
      s->prefill = std::make_unique<cuda::PrefillAttention>(s->attn);
      shards.push_back(std::move(s));
    }
    {
      DeviceScope on(home());
      sampler = std::make_unique<cuda::GpuSampler>(c.vocab_size, opt.sampling);
      ids = cuda::device_alloc<int32_t>(size_t(rows_cap), "tensor parallel: token ids");
      pos = upload_positions(opt.n_ctx, "tensor parallel");
      sampled = cuda::device_alloc<int32_t>(1, "tensor parallel: the sampled token");
      void* h = nullptr;
      cuda::check_cuda(cudaHostAlloc(&h, size_t(rows_cap + 1) * sizeof(int32_t), cudaHostAllocPortable),
                       "cudaHostAlloc (token ids)");
      host_ids = static_cast<int32_t*>(h);
      cuda::check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
    }
    place_histories();
  } catch (...) {
    release();
    throw;
  }
}

// Each shard's HistoryView with its share of a GPU's budget. --gpu-kv-mem
// is per GPU, split evenly between the shards on it. Without it every shard
// gets the smallest share any GPU offers (its free memory less the margin
// and its shards' sliding rings, measured once per GPU before any view takes
// memory), so that equal shards land on the same placement even when the
// home GPU holds a little more (sampler, logits). Every shard must land on
// the same placement: the steps and the reports assume one.
void TensorParallelRuntime::Impl::place_histories() {
  const int64_t pages = (opt.n_ctx + opt.page_size - 1) / opt.page_size;
  const size_t ring = SlidingRing::bytes_for(shards[0]->attn, layer_windows(c), rows_cap, pages);
  std::vector<int> seen;
  size_t smallest = SIZE_MAX;
  for (const auto& s : shards) {
    if (std::find(seen.begin(), seen.end(), s->device) != seen.end()) continue;
    seen.push_back(s->device);
    const size_t sharing = size_t(std::count_if(shards.begin(), shards.end(),
                                                [&](const auto& o) { return o->device == s->device; }));
    DeviceScope on(s->device);
    const cuda::GpuMemory mem = cuda::gpu_memory();
    const size_t gpu = opt.gpu_kv_mem > 0 ? opt.gpu_kv_mem : route::default_gpu_kv_budget(mem.free, mem.total);
    const size_t rings = opt.gpu_kv_mem > 0 ? 0 : sharing * ring;  // an explicit budget is the history's alone
    smallest = std::min(smallest, gpu > rings ? (gpu - rings) / sharing : 0);
  }
  for (size_t i = 0; i < shards.size(); ++i) {
    TpShard& s = *shards[i];
    RuntimeOptions mine = opt;
    mine.gpu_kv_mem = std::max<size_t>(smallest, 1);
    DeviceScope on(s.device);
    // One conversion of each page (whole pages: every head), by shard 0's
    // view; the others read what it publishes (their heads' sections).
    const HistoryView* converter = i > 0 ? shards[0]->history.get() : nullptr;
    s.history = std::make_unique<HistoryView>(*seq, layer_windows(c), rows_cap, s.attn, mine, s.stats, SIZE_MAX,
                                              converter);
  }
  for (const auto& s : shards)
    if (s->stats.placement.placement != shards[0]->stats.placement.placement)
      throw Error(fmt::format("tensor parallel: GPU {} would hold its history {} and GPU {} {} (their budgets "
                              "differ); give --kv-placement host, or a --gpu-kv-mem every GPU has",
                              shards[0]->device, route::placement_name(shards[0]->stats.placement.placement),
                              s->device, route::placement_name(s->stats.placement.placement)));
}

TensorParallelRuntime::Impl::~Impl() { release(); }

void TensorParallelRuntime::Impl::release() {
  for (auto& s : shards) {
    DeviceScope on(s->device, false);
    if (s->engine) s->engine->synchronize();
  }
  // The views that read shard 0's conversions go before it (it owns them),
  // every view (its device pages, the conversions) before the store.
  for (auto it = shards.rbegin(); it != shards.rend(); ++it) {
    DeviceScope on((*it)->device, false);
    (*it)->history.reset();
    (*it)->engine.reset();
    (*it)->prefill.reset();
  }
  shards.clear();
  seq.reset();
  if (fw) {
    DeviceScope on(home(), false);
    cudaStreamSynchronize(fw->home_stream());
    sampler.reset();
    cudaFree(ids);
    cudaFree(pos);
    cudaFree(sampled);
    if (host_ids) cudaFreeHost(host_ids);
    if (done) cudaEventDestroy(done);
  }
  ids = nullptr;
  pos = nullptr;
  sampled = nullptr;
  host_ids = nullptr;
  done = nullptr;
}

void TensorParallelRuntime::Impl::check_tokens(std::span<const int32_t> tokens) const {
  check_sequence_tokens(c, tokens, seq->n_tokens(), opt.n_ctx);
}

// Every shard's page tables for a step over n_tokens, all of one route: a
// page that background conversion publishes while the shards' tables are
// built would be read exact by some shards and compressed by others, so the
// tables are built again until the published pages did not move meanwhile
// (publication only adds pages: this ends).
void TensorParallelRuntime::Impl::build_tables(int64_t n_tokens) {
  std::vector<std::vector<cuda::SeqPages>> tables(shards.size());
  for (uint64_t version = shards[0]->history->route_version();;) {
    for (size_t i = 0; i < shards.size(); ++i) {
      TpShard& s = *shards[i];
      DeviceScope on(s.device);
      s.route = RouteCounts{};
      tables[i] = s.history->engine_tables(n_tokens, fw->stream(int(i)), s.route);
    }
    const uint64_t now = shards[0]->history->route_version();
    if (now == version) break;
    version = now;
  }
  for (size_t i = 0; i < shards.size(); ++i) {
    DeviceScope on(shards[i]->device);
    shards[i]->engine->update(tables[i]);
    shards[i]->engine->begin_step();
  }
}

// One chunk (a decode step: one row through each shard's engine; prefill:
// rows attending each shard's device copies), committed, its token sampled.
int32_t TensorParallelRuntime::Impl::run_chunk(std::span<const int32_t> tokens, bool decode) {
  const int64_t pos0 = seq->n_tokens();
  const int T = int(tokens.size());
  seq->reserve(T);  // may throw (store full): nothing written yet
  for (auto& s : shards) {
    DeviceScope on(s->device);
    s->history->prepare(pos0, T, !decode, fw->stream(int(&s - shards.data())));
  }
  if (decode) build_tables(pos0 + 1);
  DeviceScope home_scope(home());
  const cudaStream_t hs = fw->home_stream();
  std::copy(tokens.begin(), tokens.end(), host_ids);
  cuda::check_cuda(cudaMemcpyAsync(ids, host_ids, size_t(T) * sizeof(int32_t), cudaMemcpyHostToDevice, hs),
                   "upload token ids");
  const ShardAttention attend = [&](int i, int l, int rows, const float* q, const float* k, const float* v,
                                    float* out, cuda::Int8Blocks out_int8) {
    TpShard& s = *shards[size_t(i)];
    s.history->write_kv(l, pos0, rows, k, v, fw->stream(i));
    if (decode) {
      s.engine->enqueue_layer(l, q, out, nullptr, out_int8);
      return out_int8.codes != nullptr;
    }
    s.history->prefill_attention(l, pos0, rows, q, out, *s.prefill, fw->stream(i));
    return false;
  };
  fw->run(ids, pos + pos0, T, attend, false);
  sampler->sample(fw->logits(), sampled, hs);
  cuda::check_cuda(cudaMemcpyAsync(host_ids + rows_cap, sampled, sizeof(int32_t), cudaMemcpyDeviceToHost, hs),
                   "download the sampled token");
  cuda::check_cuda(cudaEventRecord(done, hs), "cudaEventRecord");
  // The home stream waited for every shard (the logits' gather), so their K/V
  // are in the host pages once this returns.
  cuda::check_cuda(cudaEventSynchronize(done), "waiting for the step");
  has_logits = true;
  seq->commit(T);
  for (auto& s : shards) {  // every shard's figures first: shard 0's conversion (committed) may throw
    if (!decode) continue;
    const cuda::DecodeEngine::SeqFigures f = s->engine->sequence_figures(0);
    s->stats.streamed_bytes += f.streamed;
    s->stats.resident_bytes += f.resident;
    s->stats.sliding_bytes += f.windowed_resident;
    s->stats.copies += f.copies;
    ++s->stats.decode_steps;
    s->route.add_to(s->stats);
  }
  for (auto& s : shards) s->history->committed();  // shard 0 converts for all
  return host_ids[rows_cap];
}

TensorParallelRuntime::TensorParallelRuntime(const gguf::File& f, const model::ModelConfig& c,
                                             const RuntimeOptions& opt, const std::vector<int>& devices)
    : impl_(std::make_unique<Impl>(f, c, opt, devices)) {}

TensorParallelRuntime::~TensorParallelRuntime() = default;

int32_t TensorParallelRuntime::prefill(std::span<const int32_t> prompt, const ProgressFn& progress) {
  Impl& I = *impl_;
  if (prompt.empty()) throw InvalidArgument("prefill: the prompt is empty");
  I.check_tokens(prompt);
  int chunk = I.opt.prefill_chunk;  // the shards' plans' smallest chunk (a streamed plan's may be smaller)
  int32_t next = -1;
  const auto end_prefill = [&] {
    for (auto& s : I.shards) {
      DeviceScope on(s->device);
      s->stats.prefill_moved_bytes = s->history->prefill_done(I.fw->stream(int(&s - I.shards.data())));
    }
  };
  try {
    for (auto& s : I.shards) {  // each shard's plan under its own budget; the chunks are the same
      DeviceScope on(s->device);
      const cudaStream_t st = I.fw->stream(int(&s - I.shards.data()));
      const int asked = I.opt.prefill_chunk;
      route::PrefillPlan plan = s->history->plan_prefill(int64_t(prompt.size()), asked, asked);
      try {
        s->history->begin_prefill(plan, st);
      } catch (const cuda::CudaError&) {
        if (plan.streamed) throw;
        // The budget said the prompt fits, the device memory is not there now: stream it (as GpuSequence does).
        plan = s->history->plan_prefill(int64_t(prompt.size()), asked, asked, /*allow_resident=*/false);
        s->history->begin_prefill(plan, st);
      }
      chunk = std::min(chunk, plan.chunk);
      s->stats.prefill_streamed = plan.streamed;
      s->stats.prefill_chunk = plan.chunk;
      s->stats.prefill_staging_pages = plan.staging_pages;
    }
    for (size_t done = 0; done < prompt.size();) {
      const size_t n = std::min(prompt.size() - done, size_t(chunk));
      next = I.run_chunk(prompt.subspan(done, n), false);
      done += n;
      if (progress) progress(int64_t(done), int64_t(prompt.size()));
    }
  } catch (...) {
    try {
      end_prefill();
    } catch (const Error&) {
    }
    throw;
  }
  end_prefill();
  return next;
}

int32_t TensorParallelRuntime::decode(int32_t token) {
  const int32_t one[1] = {token};
  impl_->check_tokens(one);
  return impl_->run_chunk(one, true);
}

std::vector<float> TensorParallelRuntime::last_logits() const {
  const Impl& I = *impl_;
  if (!I.has_logits) throw InvalidArgument("last_logits: nothing was run yet");
  std::vector<float> out(size_t(I.c.vocab_size));
  DeviceScope on(I.home());
  cuda::check_cuda(cudaMemcpy(out.data(), I.fw->logits(), out.size() * sizeof(float), cudaMemcpyDeviceToHost),
                   "download logits");
  return out;
}

void TensorParallelRuntime::wait_conversions() {
  if (!impl_->shards.empty()) impl_->shards[0]->history->wait_conversions();  // shard 0 converts for all
}

int64_t TensorParallelRuntime::n_tokens() const { return impl_->seq->n_tokens(); }
int TensorParallelRuntime::n_shards() const { return impl_->fw->n_shards(); }
const model::ModelConfig& TensorParallelRuntime::config() const { return impl_->c; }
const RuntimeStats& TensorParallelRuntime::stats(int shard) const { return impl_->shards.at(size_t(shard))->stats; }
bool TensorParallelRuntime::uses_nccl() const { return impl_->fw->uses_nccl(); }

}  // namespace activekv::runtime
