// The decode engine by KV-head shard over several GPUs. See
// include/activekv/cuda/sharded_engine.h.
#include "activekv/cuda/sharded_engine.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <set>
#include <string>

#include "activekv/kv/head_shard.h"
#include "cuda_check.h"
#include "device_buffer.h"
#include "device_scope.h"

namespace activekv::cuda {
namespace {

cudaEvent_t ev(void* p) { return static_cast<cudaEvent_t>(p); }

}  // namespace

std::vector<HeadShard> plan_head_shards(int n_kv_heads, const std::vector<int>& devices) {
  if (devices.empty()) throw InvalidArgument("head shards: no device given");
  for (int d : devices)
    if (d < 0) throw InvalidArgument("head shards: device " + std::to_string(d) + " is negative");
  const std::vector<kv::HeadRange> heads = kv::split_heads(n_kv_heads, int(devices.size()));
  std::vector<HeadShard> out;
  for (size_t i = 0; i < devices.size(); ++i) out.push_back({devices[i], heads[i].head0, heads[i].heads});
  return out;
}

// A shard's query and output slices (its heads only, [n_seq][its q heads][..])
// and the event the home stream waits for.
struct ShardedDecodeEngine::Shard {
  std::unique_ptr<DevBuf> q, out, lse;
  void* done = nullptr;  // cudaEvent_t on the shard's device
};

ShardedDecodeEngine::ShardedDecodeEngine(const EngineConfig& cfg, const std::vector<int>& devices) : cfg_(cfg) {
  cfg_.attn.validate();
  if (cfg_.attn.sharded()) throw InvalidArgument("ShardedDecodeEngine: the config must have every KV head (no kv_head0)");
  shards_ = plan_head_shards(cfg_.attn.n_kv_heads, devices);
  int n_dev = 0;
  AKV_CUDA(cudaGetDeviceCount(&n_dev));
  for (const HeadShard& s : shards_)
    if (s.device >= n_dev)
      throw InvalidArgument("ShardedDecodeEngine: GPU " + std::to_string(s.device) + " does not exist (" +
                            std::to_string(n_dev) + " found)");
  const int home = shards_[0].device;
  {
    DeviceScope d(home);
    cudaEvent_t e;
    AKV_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    home_ready_ = e;
  }
  for (const HeadShard& s : shards_) {
    enable_peer_access(s.device, home);  // the output slices go home over NVLink where the GPUs can
    DeviceScope d(s.device);
    EngineConfig c = cfg_;
    if (s.device != home) c.compute_stream = nullptr;  // a stream belongs to one device: the shard makes its own
    c.attn.kv_head0 = s.kv_head0;
    c.attn.n_kv_heads = s.kv_heads;
    c.attn.page_kv_heads = cfg_.attn.n_kv_heads;
    engines_.push_back(std::make_unique<DecodeEngine>(c));
    auto b = std::make_unique<Shard>();
    cudaEvent_t e;
    AKV_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    b->done = e;
    bufs_.push_back(std::move(b));
  }
}

ShardedDecodeEngine::~ShardedDecodeEngine() {
  for (size_t i = 0; i < engines_.size(); ++i) {
    DeviceScope d(shards_[i].device, false);  // a destructor: a device that is gone must not throw
    engines_[i].reset();  // synchronises its streams
    bufs_[i]->q.reset();
    bufs_[i]->out.reset();
    bufs_[i]->lse.reset();
    cudaEventDestroy(ev(bufs_[i]->done));
  }
  if (home_ready_) {
    DeviceScope d(shards_[0].device, false);
    cudaEventDestroy(ev(home_ready_));
  }
}

bool ShardedDecodeEngine::passthrough() const {
  return shards_.size() == 1;  // one shard: every head, on the home device
}

cudaStream_t ShardedDecodeEngine::compute_stream() const { return engines_[0]->compute_stream(); }

void ShardedDecodeEngine::reserve(size_t n_seq) {
  n_seq_ = n_seq;
  if (n_seq <= cap_seq_ || passthrough()) return;
  synchronize();  // the old slices may still be in use
  for (size_t i = 0; i < shards_.size(); ++i) {
    DeviceScope d(shards_[i].device);
    // Room for every layer (enqueue_step moves all layers' slices at once).
    const size_t rows = size_t(cfg_.n_layers) * n_seq * size_t(engines_[i]->config().attn.n_q_heads());
    Shard& b = *bufs_[i];
    b.q = std::make_unique<DevBuf>(rows * cfg_.attn.head_dim * sizeof(float), "ShardedDecodeEngine: query slice");
    b.out = std::make_unique<DevBuf>(rows * cfg_.attn.head_dim * sizeof(float), "ShardedDecodeEngine: output slice");
    b.lse = std::make_unique<DevBuf>(rows * sizeof(float), "ShardedDecodeEngine: LSE slice");
  }
  cap_seq_ = n_seq;
}

void ShardedDecodeEngine::update(const std::vector<SeqPages>& seqs) {
  std::set<int> devices;
  for (const HeadShard& s : shards_) devices.insert(s.device);
  if (devices.size() > 1)
    for (size_t s = 0; s < seqs.size(); ++s)
      for (size_t l = 0; l < seqs[s].tables.size(); ++l)
        for (size_t p = 0; p < seqs[s].tables[l].size(); ++p)
          if (seqs[s].tables[l][p].device)
            throw InvalidArgument("ShardedDecodeEngine::update: sequence " + std::to_string(s) + " layer " +
                                  std::to_string(l) + " page " + std::to_string(p) +
                                  " has a device copy, but the shards are on several GPUs (give each shard its "
                                  "own tables)");
  update(std::vector<std::vector<SeqPages>>(shards_.size(), seqs));
}

void ShardedDecodeEngine::update(const std::vector<std::vector<SeqPages>>& per_shard) {
  ready_ = false;
  if (per_shard.size() != shards_.size())
    throw InvalidArgument("ShardedDecodeEngine::update: " + std::to_string(per_shard.size()) + " tables for " +
                          std::to_string(shards_.size()) + " shards");
  for (size_t i = 0; i < shards_.size(); ++i) {
    if (per_shard[i].size() != per_shard[0].size())
      throw InvalidArgument("ShardedDecodeEngine::update: shard " + std::to_string(i) + " has " +
                            std::to_string(per_shard[i].size()) + " sequences, shard 0 " +
                            std::to_string(per_shard[0].size()));
    DeviceScope d(shards_[i].device);
    engines_[i]->update(per_shard[i]);
  }
  reserve(per_shard[0].size());
  ready_ = true;
}

void ShardedDecodeEngine::begin_step() {
  if (!ready_) throw InvalidArgument("ShardedDecodeEngine: no batch (call update() first, and again after it failed)");
  for (size_t i = 0; i < shards_.size(); ++i) {
    DeviceScope d(shards_[i].device);
    engines_[i]->begin_step();
  }
}

// Enqueues, for `rows` rows of `layers` layers (rows = layers x n_seq), each
// shard's query slice -> its engine's work (`body`) -> its output and LSE
// slices back home; the shards start after the home stream's work so far and
// the home stream waits for all of them.
template <class Body>
void ShardedDecodeEngine::fan_out(size_t rows, const float* q, float* out, float* out_lse, Body body) {
  const int home = shards_[0].device;
  const size_t hd = size_t(cfg_.attn.head_dim), nq = size_t(cfg_.attn.n_q_heads()), g = size_t(cfg_.attn.group);
  {
    DeviceScope d(home);
    AKV_CUDA(cudaEventRecord(ev(home_ready_), compute_stream()));  // q written, earlier readers of out done
  }
  for (size_t i = 0; i < shards_.size(); ++i) {
    const HeadShard& s = shards_[i];
    DeviceScope d(s.device);
    DecodeEngine& e = *engines_[i];
    Shard& b = *bufs_[i];
    const cudaStream_t st = e.compute_stream();
    const size_t mine = size_t(s.kv_heads) * g, first = size_t(s.kv_head0) * g;  // its query heads
    if (i > 0) AKV_CUDA(cudaStreamWaitEvent(st, ev(home_ready_), 0));
    copy_rows(b.q->p, s.device, mine * hd * 4, q + first * hd, home, nq * hd * 4, mine * hd * 4, rows, st);
    body(e, b.q->as<float>(), b.out->as<float>(), out_lse ? b.lse->as<float>() : nullptr);
    copy_rows(out + first * hd, home, nq * hd * 4, b.out->p, s.device, mine * hd * 4, mine * hd * 4, rows, st);
    if (out_lse) copy_rows(out_lse + first, home, nq * 4, b.lse->p, s.device, mine * 4, mine * 4, rows, st);
    if (i > 0) AKV_CUDA(cudaEventRecord(ev(b.done), st));
  }
  DeviceScope d(home);
  for (size_t i = 1; i < shards_.size(); ++i) AKV_CUDA(cudaStreamWaitEvent(compute_stream(), ev(bufs_[i]->done), 0));
}

void ShardedDecodeEngine::enqueue_layer(int layer, const float* q, float* out, float* out_lse) {
  if (!ready_) throw InvalidArgument("ShardedDecodeEngine::enqueue_layer: no batch (call update() first)");
  if (passthrough()) {
    DeviceScope d(shards_[0].device);
    engines_[0]->enqueue_layer(layer, q, out, out_lse);
    return;
  }
  fan_out(n_seq_, q, out, out_lse, [&](DecodeEngine& e, const float* lq, float* lo, float* ll) {
    e.enqueue_layer(layer, lq, lo, ll);
  });
}

// All layers at once: one slice copy each way per shard, and no barrier
// between the shards' layers (every layer's queries are there already).
void ShardedDecodeEngine::enqueue_step(const float* q, float* out, float* out_lse) {
  if (!ready_) throw InvalidArgument("ShardedDecodeEngine: no batch (call update() first, and again after it failed)");
  if (passthrough()) {
    DeviceScope d(shards_[0].device);
    engines_[0]->enqueue_step(q, out, out_lse);
    return;
  }
  fan_out(size_t(cfg_.n_layers) * n_seq_, q, out, out_lse,
          [](DecodeEngine& e, const float* lq, float* lo, float* ll) { e.enqueue_step(lq, lo, ll); });
}

void ShardedDecodeEngine::synchronize() {
  for (size_t i = 0; i < shards_.size(); ++i) {
    DeviceScope d(shards_[i].device);
    engines_[i]->synchronize();
  }
}

size_t ShardedDecodeEngine::bytes_per_step() const {
  size_t n = 0;
  for (const auto& e : engines_) n += e->bytes_per_step();
  return n;
}
size_t ShardedDecodeEngine::copies_per_step() const {
  size_t n = 0;
  for (const auto& e : engines_) n += e->copies_per_step();
  return n;
}
size_t ShardedDecodeEngine::copy_rows_per_step() const {
  size_t n = 0;
  for (const auto& e : engines_) n += e->copy_rows_per_step();
  return n;
}
size_t ShardedDecodeEngine::largest_copy() const {
  size_t n = 0;
  for (const auto& e : engines_) n = std::max(n, e->largest_copy());
  return n;
}
size_t ShardedDecodeEngine::resident_bytes_per_step() const {
  size_t n = 0;
  for (const auto& e : engines_) n += e->resident_bytes_per_step();
  return n;
}

}  // namespace activekv::cuda
