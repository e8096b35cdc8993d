// The decode engine across several GPUs by KV-head shard (issue 15, parts
// 1-2): each shard is one DecodeEngine on one device that streams and
// attends only its KV heads' bytes of every page, over its device's own
// link, with its own staging ring, streams and kernel configuration.
//
// Shards
//   `devices` lists one device per shard (plan_head_shards: the KV heads
//   split in order, as evenly as they allow; kv::split_heads). A device may
//   appear more than once: `0,0` runs two shards on device 0, each with its
//   own staging and streams, sharing that device's link -- the way to test
//   the sharding and its exactness on one GPU. The first device is the home
//   device: the queries, outputs and LSE of enqueue_step / enqueue_layer
//   live there, in the whole model's layout.
//
// Pages
//   The host pages are the one page store's, whole (every head): a shard
//   copies only its ranges of each page (kv::shard_byte_ranges: a bf16 page
//   gives two, its K planes and its V planes; an int8s page one, its heads'
//   sections; a lossless13 page three, header and directory, K planes, V
//   planes) to the same offsets of its staging slot, and its kernels read
//   its heads there (AttnShape::kv_head0). A resident page (PageRef::device)
//   is a whole page on the shard's device; shards on one device may share it.
//   Pages marked `cpu` are refused (the CPU share attends whole pages).
//
// Per layer (enqueue_layer) or per step (enqueue_step: all layers at once)
//   The home stream's queries are ready -> each shard copies its query
//   heads (one strided slice over every row) into its own buffer, runs the
//   layer (or step) as DecodeEngine does, and copies its heads' outputs and
//   LSE back home; the home stream waits for every shard. So enqueue_layer
//   is a barrier per layer (a model needs one anyway), enqueue_step one per
//   step. A single shard of every head is the plain DecodeEngine, no copy.
//
// Exactness: attention of one KV head does not depend on the other heads;
// each shard runs the same kernels at the same split boundaries with the
// same merge, so the output is bitwise identical to one unsharded engine.
//
// Not thread-safe. Selects each shard's device while it works and restores
// the caller's current device.
#pragma once

#include <memory>
#include <vector>

#include "activekv/cuda/decode_engine.h"

namespace activekv::cuda {

/// One shard: the device and the KV heads [kv_head0, kv_head0 + kv_heads) it attends.
struct HeadShard {
  int device = 0;
  int kv_head0 = 0;
  int kv_heads = 0;
  bool operator==(const HeadShard&) const = default;
};

/// One shard per entry of `devices` (any order, repeats allowed), the KV
/// heads split as kv::split_heads does. Throws InvalidArgument for no
/// device, a negative device, or more shards than KV heads. Checks no GPU.
std::vector<HeadShard> plan_head_shards(int n_kv_heads, const std::vector<int>& devices);

class ShardedDecodeEngine {
 public:
  /// cfg: the whole model's configuration (cfg.attn unsharded: every KV
  /// head). Creates one DecodeEngine per shard on its device. Throws
  /// InvalidArgument for a bad config or device list, CudaError when a
  /// device cannot be used.
  ShardedDecodeEngine(const EngineConfig& cfg, const std::vector<int>& devices);
  ~ShardedDecodeEngine();
  ShardedDecodeEngine(const ShardedDecodeEngine&) = delete;
  ShardedDecodeEngine& operator=(const ShardedDecodeEngine&) = delete;

  /// The batch of the next step, the same tables for every shard (host
  /// pages; device copies only when every shard is on one device).
  /// Contract and errors as DecodeEngine::update, plus InvalidArgument for a
  /// resident page when shards are on several devices. After a failure no
  /// shard holds a batch.
  void update(const std::vector<SeqPages>& seqs);
  /// Per shard tables ([shard] -> the batch as that shard reads it): the
  /// same host pages, device copies on the shard's own device.
  void update(const std::vector<std::vector<SeqPages>>& per_shard);

  /// As DecodeEngine (q, out, out_lse on the home device, the whole model's
  /// layout: [n_layers][n_seq][n_q_heads][head_dim], LSE [n_layers][n_seq][n_q_heads]).
  void enqueue_step(const float* q, float* out, float* out_lse);
  void begin_step();
  void enqueue_layer(int layer, const float* q, float* out, float* out_lse);

  /// The home stream: a step is ordered after the work on it, and it waits for every shard.
  cudaStream_t compute_stream() const;
  /// Waits for every shard's streams (host sync; between steps only).
  void synchronize();

  int n_shards() const { return int(shards_.size()); }
  const HeadShard& shard(int i) const { return shards_.at(size_t(i)); }
  /// Shard i's engine (its statistics, job_info, config with its head range).
  const DecodeEngine& engine(int i) const { return *engines_.at(size_t(i)); }
  DecodeEngine& engine(int i) { return *engines_.at(size_t(i)); }
  const EngineConfig& config() const { return cfg_; }
  /// Sums over the shards (largest_copy: the largest of any shard).
  size_t bytes_per_step() const;
  size_t copies_per_step() const;
  size_t copy_rows_per_step() const;
  size_t largest_copy() const;
  size_t resident_bytes_per_step() const;

 private:
  struct Shard;
  bool passthrough() const;  // one shard of every head on the home device
  void reserve(size_t n_seq);
  template <class Body>
  void fan_out(size_t rows, const float* q, float* out, float* out_lse, Body body);

  EngineConfig cfg_;
  std::vector<HeadShard> shards_;
  std::vector<std::unique_ptr<DecodeEngine>> engines_;
  std::vector<std::unique_ptr<Shard>> bufs_;  // per shard: query/output slices, done event
  void* home_ready_ = nullptr;                // cudaEvent_t on the home device
  size_t n_seq_ = 0, cap_seq_ = 0;  // sequences of the batch; room of the slices
  bool ready_ = false;
};

}  // namespace activekv::cuda
