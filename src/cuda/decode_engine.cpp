// Streaming / resident decode engine. See include/activekv/cuda/decode_engine.h.
#include "activekv/cuda/decode_engine.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>

namespace activekv::cuda {

namespace {
#define AKV_CUDA(call) check_cuda(static_cast<int>(call), #call)

cudaEvent_t ev(void* p) { return static_cast<cudaEvent_t>(p); }

std::string gib(size_t bytes) { return std::to_string(double(bytes) / double(1ull << 30)) + " GiB"; }
}  // namespace

PinnedPagePool::PinnedPagePool(size_t page_bytes, size_t n_pages)
    : page_bytes_(page_bytes), n_pages_(n_pages) {
  if (page_bytes == 0 || n_pages == 0)
    throw InvalidArgument("PinnedPagePool: page_bytes and n_pages must be positive");
  void* p = nullptr;
  const size_t bytes = page_bytes * n_pages;
  const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw CudaError("PinnedPagePool: cudaHostAlloc of " + std::to_string(bytes) + " bytes (" +
                    gib(bytes) + ") failed: " + cudaGetErrorString(e));
  }
  data_ = static_cast<std::byte*>(p);
}

PinnedPagePool::~PinnedPagePool() {
  if (data_) cudaFreeHost(data_);
}

DecodeEngine::DecodeEngine(const EngineConfig& cfg, const PinnedPagePool& pool)
    : cfg_(cfg), pool_(&pool) {
  cfg_.attn.validate();
  if (cfg_.n_layers <= 0) throw InvalidArgument("EngineConfig: n_layers must be positive");
  if (cfg_.tile_pages < 0) throw InvalidArgument("EngineConfig: tile_pages must be >= 0");
  if (cfg_.ring_slots < 2) throw InvalidArgument("EngineConfig: ring_slots must be >= 2");
  if (pool.page_bytes() != cfg_.attn.page_bytes())
    throw InvalidArgument("DecodeEngine: pool page_bytes " + std::to_string(pool.page_bytes()) +
                          " does not match the shape's " + std::to_string(cfg_.attn.page_bytes()));
  AKV_CUDA(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  AKV_CUDA(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  for (int i = 0; i < cfg_.ring_slots; ++i) {
    cudaEvent_t a, b;
    AKV_CUDA(cudaEventCreateWithFlags(&a, cudaEventDisableTiming));
    AKV_CUDA(cudaEventCreateWithFlags(&b, cudaEventDisableTiming));
    events_copy_.push_back(a);
    events_compute_.push_back(b);
  }
  if (cfg_.mode == Mode::resident) {
    const size_t bytes = pool.page_bytes() * pool.n_pages();
    const cudaError_t e = cudaMalloc(&dev_pool_, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw CudaError("DecodeEngine(resident): cudaMalloc of " + gib(bytes) +
                      " for the resident history failed: " + cudaGetErrorString(e));
    }
    AKV_CUDA(cudaMemcpy(dev_pool_, pool.data(), bytes, cudaMemcpyHostToDevice));
  }
}

void DecodeEngine::free_device() {
  if (staging_) cudaFree(staging_);
  if (work_dev_) cudaFree(work_dev_);
  if (n_splits_dev_) cudaFree(n_splits_dev_);
  if (partials_.o) cudaFree(partials_.o);
  if (partials_.lse) cudaFree(partials_.lse);
  staging_ = nullptr;
  work_dev_ = nullptr;
  n_splits_dev_ = nullptr;
  partials_ = {};
}

DecodeEngine::~DecodeEngine() {
  if (compute_) cudaStreamSynchronize(compute_);
  if (copy_) cudaStreamSynchronize(copy_);
  free_device();
  if (dev_pool_) cudaFree(dev_pool_);
  for (void* e : events_copy_) cudaEventDestroy(ev(e));
  for (void* e : events_compute_) cudaEventDestroy(ev(e));
  if (compute_) cudaStreamDestroy(compute_);
  if (copy_) cudaStreamDestroy(copy_);
}

void DecodeEngine::set_batch(const std::vector<SeqPages>& seqs) {
  const AttnShape& sh = cfg_.attn;
  if (seqs.empty()) throw InvalidArgument("DecodeEngine::set_batch: empty batch");
  synchronize();
  free_device();
  n_seq_ = int(seqs.size());
  const int64_t ps = sh.page_size;
  const int splits_per_page = sh.page_size / sh.split_tokens;

  // Entries of one layer: (seq, page index), sequence-major.
  struct Entry { int seq; int64_t page; };
  std::vector<Entry> entries;
  std::vector<int32_t> n_splits(n_seq_);
  int max_splits = 1;
  for (int s = 0; s < n_seq_; ++s) {
    const SeqPages& sp = seqs[s];
    if (sp.n_tokens < 0) throw InvalidArgument("set_batch: sequence " + std::to_string(s) + " has n_tokens < 0");
    if (int(sp.tables.size()) != cfg_.n_layers)
      throw InvalidArgument("set_batch: sequence " + std::to_string(s) + " has " +
                            std::to_string(sp.tables.size()) + " page tables, the model has " +
                            std::to_string(cfg_.n_layers) + " layers");
    const int64_t np = (sp.n_tokens + ps - 1) / ps;
    for (int l = 0; l < cfg_.n_layers; ++l) {
      if (int64_t(sp.tables[l].size()) < np)
        throw InvalidArgument("set_batch: sequence " + std::to_string(s) + " layer " + std::to_string(l) +
                              " page table has " + std::to_string(sp.tables[l].size()) + " pages, " +
                              std::to_string(np) + " needed for " + std::to_string(sp.n_tokens) + " tokens");
      for (int64_t p = 0; p < np; ++p)
        if (sp.tables[l][p] >= pool_->n_pages())
          throw InvalidArgument("set_batch: page id " + std::to_string(sp.tables[l][p]) +
                                " outside the pool of " + std::to_string(pool_->n_pages()) + " pages");
    }
    for (int64_t p = 0; p < np; ++p) entries.push_back({s, p});
    n_splits[s] = int32_t((sp.n_tokens + sh.split_tokens - 1) / sh.split_tokens);
    max_splits = std::max(max_splits, int(n_splits[s]));
  }
  const int64_t E = int64_t(entries.size());
  const size_t pb = sh.page_bytes();
  const bool streamed = cfg_.mode == Mode::streamed;
  job_pages_ = int(std::max<int64_t>(1, (!streamed || cfg_.tile_pages == 0) ? E : std::min<int64_t>(cfg_.tile_pages, E)));
  const int64_t n_jobs = E == 0 ? 0 : (E + job_pages_ - 1) / job_pages_;

  auto dev_alloc = [](void** p, size_t bytes, const char* what) {
    const cudaError_t e = cudaMalloc(p, std::max<size_t>(bytes, 16));
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw CudaError(std::string("DecodeEngine::set_batch: cudaMalloc of ") + std::to_string(bytes) +
                      " bytes for " + what + " failed: " + cudaGetErrorString(e));
    }
  };
  if (streamed && E > 0)
    dev_alloc(reinterpret_cast<void**>(&staging_), size_t(cfg_.ring_slots) * job_pages_ * pb, "the staging ring");

  std::vector<SplitWork> work;
  jobs_.assign(size_t(n_jobs), Job{});
  bytes_per_step_ = 0;
  copies_per_step_ = 0;
  largest_copy_ = 0;
  for (int64_t j = 0; j < n_jobs; ++j) {
    Job& job = jobs_[j];
    const int64_t e0 = j * job_pages_, e1 = std::min(E, e0 + job_pages_);
    // Work lists: one per slot (streamed) or per layer (resident).
    const int n_lists = streamed ? cfg_.ring_slots : cfg_.n_layers;
    for (int r = 0; r < n_lists; ++r) {
      job.work_off.push_back(work.size());
      for (int64_t e = e0; e < e1; ++e) {
        const Entry& en = entries[e];
        const int64_t valid = std::min<int64_t>(ps, seqs[en.seq].n_tokens - en.page * ps);
        const std::byte* page =
            streamed ? staging_ + (size_t(r) * job_pages_ + size_t(e - e0)) * pb
                     : dev_pool_ + size_t(seqs[en.seq].tables[r][en.page]) * pb;
        for (int k = 0; k < splits_per_page; ++k) {
          const int64_t t0 = int64_t(k) * sh.split_tokens;
          if (t0 >= valid) break;
          SplitWork w;
          w.page = page;
          w.seq = en.seq;
          w.tok0 = int32_t(t0);
          w.ntok = int32_t(std::min<int64_t>(sh.split_tokens, valid - t0));
          w.split = int32_t(en.page * splits_per_page + k);
          work.push_back(w);
        }
      }
    }
    job.n_work = int(work.size() - job.work_off[0]) / n_lists;
    for (int64_t e = e0; e < e1; ++e) {
      const Entry& en = entries[e];
      job.tokens += std::min<int64_t>(ps, seqs[en.seq].n_tokens - en.page * ps);
    }
    if (streamed) {
      job.runs.resize(cfg_.n_layers);
      for (int l = 0; l < cfg_.n_layers; ++l) {
        std::vector<Run>& runs = job.runs[l];
        for (int64_t e = e0; e < e1; ++e) {
          const size_t host_off = size_t(seqs[entries[e].seq].tables[l][entries[e].page]) * pb;
          const size_t stage_off = size_t(e - e0) * pb;
          if (!runs.empty() && runs.back().host_off + runs.back().bytes == host_off)
            runs.back().bytes += pb;
          else
            runs.push_back({host_off, stage_off, pb});
        }
        for (const Run& r : runs) {
          bytes_per_step_ += r.bytes;
          ++copies_per_step_;
          largest_copy_ = std::max(largest_copy_, r.bytes);
        }
      }
    }
  }

  dev_alloc(reinterpret_cast<void**>(&work_dev_), work.size() * sizeof(SplitWork), "work lists");
  AKV_CUDA(cudaMemcpy(work_dev_, work.data(), work.size() * sizeof(SplitWork), cudaMemcpyHostToDevice));
  dev_alloc(reinterpret_cast<void**>(&n_splits_dev_), n_splits.size() * sizeof(int32_t), "split counts");
  AKV_CUDA(cudaMemcpy(n_splits_dev_, n_splits.data(), n_splits.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  partials_.max_splits = max_splits;
  const size_t np_rows = size_t(n_seq_) * max_splits * sh.n_q_heads();
  dev_alloc(reinterpret_cast<void**>(&partials_.o), np_rows * sh.head_dim * sizeof(float), "partial outputs");
  dev_alloc(reinterpret_cast<void**>(&partials_.lse), np_rows * sizeof(float), "partial LSE");
  // Unused split slots must read as empty: fill LSE with -inf once.
  std::vector<float> ninf(np_rows, -__builtin_inff());
  AKV_CUDA(cudaMemcpy(partials_.lse, ninf.data(), np_rows * sizeof(float), cudaMemcpyHostToDevice));
  any_step_ = false;
  slot_base_ = 0;
  next_layer_ = 0;
  jobs_enqueued_copy_ = 0;
}

void DecodeEngine::enqueue_copy(int64_t k) {
  // k: job index within the step (layer-major).
  const int64_t J = int64_t(jobs_.size());
  const int layer = int(k / J);
  const Job& job = jobs_[size_t(k % J)];
  const int64_t g = slot_base_ + k;
  const int slot = int(g % cfg_.ring_slots);
  if (g >= cfg_.ring_slots) AKV_CUDA(cudaStreamWaitEvent(copy_, ev(events_compute_[slot]), 0));
  std::byte* base = staging_ + size_t(slot) * job_pages_ * cfg_.attn.page_bytes();
  for (const Run& r : job.runs[layer])
    AKV_CUDA(cudaMemcpyAsync(base + r.stage_off, pool_->data() + r.host_off, r.bytes,
                             cudaMemcpyHostToDevice, copy_));
  AKV_CUDA(cudaEventRecord(ev(events_copy_[slot]), copy_));
}

void DecodeEngine::ensure_copies(int64_t upto) {
  const int64_t total = int64_t(jobs_.size()) * cfg_.n_layers;
  upto = std::min(upto, total - 1);
  while (jobs_enqueued_copy_ <= upto) enqueue_copy(jobs_enqueued_copy_++);
}

void DecodeEngine::begin_step() {
  if (jobs_.empty() && n_seq_ == 0) throw InvalidArgument("DecodeEngine: set_batch() before a step");
  if (any_step_) slot_base_ += int64_t(jobs_.size()) * cfg_.n_layers;
  any_step_ = true;
  jobs_enqueued_copy_ = 0;
  next_layer_ = 0;
}

void DecodeEngine::enqueue_layer(int layer, const float* q, float* out, float* out_lse) {
  if (layer != next_layer_)
    throw InvalidArgument("DecodeEngine::enqueue_layer: expected layer " + std::to_string(next_layer_) +
                          ", got " + std::to_string(layer));
  ++next_layer_;
  const AttnShape& sh = cfg_.attn;
  const int64_t J = int64_t(jobs_.size());
  if (cfg_.mode == Mode::resident) {
    for (int64_t j = 0; j < J; ++j)
      launch_split_attention(sh, work_dev_ + jobs_[j].work_off[layer], jobs_[j].n_work, q, partials_, compute_);
  } else {
    for (int64_t j = 0; j < J; ++j) {
      const int64_t k = int64_t(layer) * J + j;
      ensure_copies(k + cfg_.ring_slots - 1);
      const int slot = int((slot_base_ + k) % cfg_.ring_slots);
      AKV_CUDA(cudaStreamWaitEvent(compute_, ev(events_copy_[slot]), 0));
      launch_split_attention(sh, work_dev_ + jobs_[j].work_off[slot], jobs_[j].n_work, q, partials_, compute_);
      AKV_CUDA(cudaEventRecord(ev(events_compute_[slot]), compute_));
    }
  }
  launch_merge(sh, partials_, n_splits_dev_, n_seq_, out, out_lse, compute_);
}

void DecodeEngine::enqueue_step(const float* q, float* out, float* out_lse) {
  begin_step();
  const size_t per_layer = size_t(n_seq_) * cfg_.attn.n_q_heads();
  for (int l = 0; l < cfg_.n_layers; ++l)
    enqueue_layer(l, q + per_layer * cfg_.attn.head_dim * l, out + per_layer * cfg_.attn.head_dim * l,
                  out_lse ? out_lse + per_layer * l : nullptr);
}

std::vector<DecodeEngine::JobInfo> DecodeEngine::job_info(int layer) const {
  std::vector<JobInfo> out;
  for (const Job& j : jobs_) {
    JobInfo ji;
    if (cfg_.mode == Mode::streamed)
      for (const Run& r : j.runs.at(size_t(layer))) ji.copy_bytes.push_back(r.bytes);
    ji.tokens = j.tokens;
    ji.n_work = j.n_work;
    out.push_back(std::move(ji));
  }
  return out;
}

void DecodeEngine::synchronize() {
  AKV_CUDA(cudaStreamSynchronize(copy_));
  AKV_CUDA(cudaStreamSynchronize(compute_));
}

void fill_random_bf16(std::byte* data, size_t bytes, uint64_t seed, int threads) {
  const size_t n = bytes / 2;
  constexpr size_t kChunk = size_t(1) << 22;  // values per chunk: seeding is per chunk
  const size_t n_chunks = (n + kChunk - 1) / kChunk;
  threads = std::max(1, threads);
  auto work = [&](int t) {
    for (size_t c = size_t(t); c < n_chunks; c += size_t(threads)) {
      uint64_t x = seed * 0x9E3779B97F4A7C15ull + c * 0xD1B54A32D192ED03ull + 1;
      uint16_t* p = reinterpret_cast<uint16_t*>(data) + c * kChunk;
      const size_t m = std::min(kChunk, n - c * kChunk);
      for (size_t i = 0; i < m; ++i) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        // uniform in [-1, 1): float with exponent 127 (1..2) minus 1.5, times 2
        const uint32_t bits = 0x3f800000u | uint32_t(x >> 41);
        float f;
        std::memcpy(&f, &bits, 4);
        f = (f - 1.5f) * 2.f;
        uint32_t fb;
        std::memcpy(&fb, &f, 4);
        p[i] = uint16_t(fb >> 16);
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
}

}  // namespace activekv::cuda
