// Streaming / resident decode engine. See include/activekv/cuda/decode_engine.h.
#include "activekv/cuda/decode_engine.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>

#include "activekv/kv/codec.h"
#include "activekv/kv/int8s_layout.h"
#include "cuda_check.h"
#include "device_buffer.h"

namespace activekv::cuda {

namespace {
cudaEvent_t ev(void* p) { return static_cast<cudaEvent_t>(p); }

std::string gib(size_t bytes) { return std::to_string(double(bytes) / double(1ull << 30)) + " GiB"; }
}  // namespace

const char* page_kind_name(PageKind k) {
  switch (k) {
    case PageKind::bf16: return "bf16";
    case PageKind::int8s: return "int8s";
    case PageKind::lossless13: return "lossless13";
  }
  return "?";
}

namespace {
constexpr size_t kArenaAlign = 256;
size_t align_up(size_t x) { return (x + kArenaAlign - 1) / kArenaAlign * kArenaAlign; }
}  // namespace

PinnedPagePool::PinnedPagePool(size_t page_bytes, size_t n_pages, size_t extra_bytes)
    : page_bytes_(page_bytes), n_pages_(n_pages) {
  if (page_bytes == 0 || (n_pages == 0 && extra_bytes == 0))
    throw InvalidArgument("PinnedPagePool: page_bytes must be positive and the pool not empty");
  used_ = align_up(page_bytes * n_pages);
  capacity_ = used_ + align_up(extra_bytes);
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, capacity_, cudaHostAllocPortable);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw CudaError("PinnedPagePool: cudaHostAlloc of " + std::to_string(capacity_) + " bytes (" +
                    gib(capacity_) + ") failed: " + cudaGetErrorString(e));
  }
  data_ = static_cast<std::byte*>(p);
}

PageRef PinnedPagePool::page_ref(uint32_t id) const {
  if (id >= n_pages_)
    throw InvalidArgument("PinnedPagePool: page id " + std::to_string(id) + " outside the " +
                          std::to_string(n_pages_) + " bf16 page slots");
  return PageRef{uint64_t(id) * page_bytes_, page_bytes_, PageKind::bf16};
}

PageRef PinnedPagePool::allocate(size_t bytes, PageKind kind) {
  if (bytes == 0) throw InvalidArgument("PinnedPagePool::allocate: zero bytes");
  if (align_up(bytes) > capacity_ - used_)
    throw InvalidArgument("PinnedPagePool::allocate: " + std::to_string(bytes) + " bytes do not fit: " +
                          std::to_string(capacity_ - used_) + " of " + std::to_string(capacity_) + " bytes left");
  const PageRef r{used_, bytes, kind};
  used_ += align_up(bytes);
  return r;
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
    const size_t bytes = pool.used_bytes();  // pages allocated later are not resident: set_batch checks
    dev_pool_ = device_alloc<std::byte>(bytes, "DecodeEngine(resident): the resident history");
    AKV_CUDA(cudaMemcpy(dev_pool_, pool.data(), bytes, cudaMemcpyHostToDevice));
    resident_bytes_ = bytes;
  }
}

void DecodeEngine::free_device() {
  for (void* p : {static_cast<void*>(staging_), static_cast<void*>(work_dev_), static_cast<void*>(unpack_dev_),
                  static_cast<void*>(unpack_scratch_), static_cast<void*>(n_splits_dev_),
                  static_cast<void*>(partials_.o), static_cast<void*>(partials_.lse)})
    if (p) cudaFree(p);
  staging_ = nullptr;
  work_dev_ = nullptr;
  unpack_dev_ = nullptr;
  unpack_scratch_ = nullptr;
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

namespace {

// Checks a page table entry against the pool and the shape without reading
// the payload (the host validated the blob when it was encoded/published).
void check_page(const PinnedPagePool& pool, size_t limit, const AttnShape& sh, const PageRef& r, int64_t needed,
                const std::string& where) {
  auto bad = [&](const std::string& m) {
    throw InvalidArgument("set_batch: " + where + " (" + page_kind_name(r.kind) + " page at byte " +
                          std::to_string(r.offset) + "): " + m);
  };
  if (r.offset % kArenaAlign != 0 && r.kind != PageKind::bf16) bad("offset is not 256-byte aligned");
  if (r.offset > limit || r.bytes > limit - r.offset)
    bad("extends past the " + std::to_string(limit) + " bytes of the pool" +
        (limit < pool.capacity_bytes() ? " copied to the GPU (allocate pages before creating a resident engine)" : ""));
  if (r.kind == PageKind::bf16) {
    if (r.bytes != sh.page_bytes()) bad("bf16 page of " + std::to_string(r.bytes) + " bytes, the shape needs " +
                                        std::to_string(sh.page_bytes()));
    return;
  }
  if (r.bytes < kv::kCodecHeaderBytes) bad("shorter than the 64-byte codec header");
  const std::byte* b = pool.data() + r.offset;
  auto u32 = [&](size_t off) { uint32_t v; std::memcpy(&v, b + off, 4); return v; };
  uint16_t fmt_id;
  std::memcpy(&fmt_id, b + 4, 2);
  const uint16_t want = uint16_t(r.kind == PageKind::int8s ? kv::CodecFormat::int8s : kv::CodecFormat::lossless13);
  if (u32(0) != kv::kCodecMagic) bad("bad magic (not a codec blob)");
  if (fmt_id != want) bad("blob holds format id " + std::to_string(fmt_id) + ", expected " + std::to_string(want));
  if (int(u32(8)) != sh.page_size || int(u32(12)) != sh.n_kv_heads || int(u32(16)) != sh.head_dim)
    bad("blob dimensions (page " + std::to_string(u32(8)) + ", heads " + std::to_string(u32(12)) + ", dim " +
        std::to_string(u32(16)) + ") differ from the shape");
  const int64_t n_tok = int64_t(u32(20));
  if (n_tok > sh.page_size)
    bad("header says " + std::to_string(n_tok) + " tokens, more than the page size " + std::to_string(sh.page_size));
  if (r.kind == PageKind::int8s) {
    if (n_tok != sh.page_size)
      bad("int8s pages must be full (" + std::to_string(n_tok) + " of " + std::to_string(sh.page_size) + " tokens)");
    if (sh.page_size % 16 != 0)
      bad("the int8s kernel needs a page size that is a multiple of 16, the shape has " + std::to_string(sh.page_size));
    const size_t want =
        kv::kCodecHeaderBytes + kv::Int8sSectionLayout{size_t(sh.head_dim), size_t(sh.page_size)}.payload_bytes(sh.n_kv_heads);
    if (r.bytes != want)
      bad("an int8s page of this shape is " + std::to_string(want) + " bytes, the entry says " +
          std::to_string(r.bytes));
  }
  if (n_tok < needed) bad("holds " + std::to_string(n_tok) + " tokens, " + std::to_string(needed) + " are read");
  uint64_t payload;
  std::memcpy(&payload, b + 24, 8);
  if (payload != r.bytes - kv::kCodecHeaderBytes)
    bad("header payload of " + std::to_string(payload) + " bytes, the entry holds " +
        std::to_string(r.bytes - kv::kCodecHeaderBytes) + " after the header");
}

}  // namespace

void DecodeEngine::set_batch(const std::vector<SeqPages>& seqs) {
  const AttnShape& sh = cfg_.attn;
  if (seqs.empty()) throw InvalidArgument("DecodeEngine::set_batch: empty batch");
  synchronize();
  // Until this call succeeds the engine holds no batch: a failed set_batch
  // leaves nothing that points into freed buffers (begin_step refuses to run).
  free_device();
  jobs_.clear();
  ready_ = false;
  n_seq_ = int(seqs.size());
  const int64_t ps = sh.page_size;
  const int splits_per_page = sh.page_size / sh.split_tokens;
  const int L = cfg_.n_layers;
  const bool streamed = cfg_.mode == Mode::streamed;
  const size_t limit = streamed ? pool_->used_bytes() : resident_bytes_;

  // Entries of one layer: (seq, page index), sequence-major.
  struct Entry { int seq; int64_t page; int64_t valid; };
  std::vector<Entry> entries;
  std::vector<int32_t> n_splits(n_seq_);
  int max_splits = 1;
  for (int s = 0; s < n_seq_; ++s) {
    const SeqPages& sp = seqs[s];
    const std::string seq_name = "sequence " + std::to_string(s);
    if (sp.n_tokens < 0) throw InvalidArgument("set_batch: " + seq_name + " has n_tokens < 0");
    if (int(sp.tables.size()) != L)
      throw InvalidArgument("set_batch: " + seq_name + " has " + std::to_string(sp.tables.size()) +
                            " page tables, the model has " + std::to_string(L) + " layers");
    const int64_t np = (sp.n_tokens + ps - 1) / ps;
    for (int l = 0; l < L; ++l) {
      if (int64_t(sp.tables[l].size()) < np)
        throw InvalidArgument("set_batch: " + seq_name + " layer " + std::to_string(l) + " page table has " +
                              std::to_string(sp.tables[l].size()) + " pages, " + std::to_string(np) +
                              " needed for " + std::to_string(sp.n_tokens) + " tokens");
      for (int64_t p = 0; p < np; ++p)
        check_page(*pool_, limit, sh, sp.tables[l][p], std::min<int64_t>(ps, sp.n_tokens - p * ps),
                   seq_name + " layer " + std::to_string(l) + " page " + std::to_string(p));
    }
    for (int64_t p = 0; p < np; ++p) entries.push_back({s, p, std::min<int64_t>(ps, sp.n_tokens - p * ps)});
    n_splits[s] = int32_t((sp.n_tokens + sh.split_tokens - 1) / sh.split_tokens);
    max_splits = std::max(max_splits, int(n_splits[s]));
    if (max_splits > kMaxMergeSplits)
      throw InvalidArgument("set_batch: " + seq_name + " has " + std::to_string(n_splits[s]) + " splits of " +
                            std::to_string(sh.split_tokens) + " tokens; the merge takes at most " +
                            std::to_string(kMaxMergeSplits) + " (use larger splits)");
  }
  const int64_t E = int64_t(entries.size());
  const size_t pb = sh.page_bytes();
  job_pages_ = int(std::max<int64_t>(1, (!streamed || cfg_.tile_pages == 0) ? E : std::min<int64_t>(cfg_.tile_pages, E)));
  const int64_t n_jobs = E == 0 ? 0 : (E + job_pages_ - 1) / job_pages_;
  auto ref = [&](int64_t e, int l) -> const PageRef& { return seqs[entries[e].seq].tables[l][entries[e].page]; };

  // Staging slot size (largest job of any layer) and unpack scratch (most lossless13 pages in a job).
  stage_slot_bytes_ = 0;
  int max_unpack = 0;
  for (int64_t j = 0; j < n_jobs; ++j)
    for (int l = 0; l < L; ++l) {
      size_t bytes = 0;
      int n13 = 0;
      for (int64_t e = j * job_pages_; e < std::min(E, (j + 1) * job_pages_); ++e) {
        bytes += align_up(ref(e, l).bytes);
        n13 += ref(e, l).kind == PageKind::lossless13;
      }
      stage_slot_bytes_ = std::max(stage_slot_bytes_, bytes);
      max_unpack = std::max(max_unpack, n13);
    }

  // Device buffers of the batch; free_device() releases them (also after a throw here).
  auto alloc = [](auto*& p, size_t count, const char* what) {
    p = device_alloc<std::remove_reference_t<decltype(*p)>>(count, std::string("DecodeEngine::set_batch: ") + what);
  };
  if (streamed && E > 0) alloc(staging_, size_t(cfg_.ring_slots) * stage_slot_bytes_, "the staging ring");
  // One unpack scratch for all jobs: safe because every job's unpack and
  // attention run in order on the one compute stream.
  if (max_unpack > 0) alloc(unpack_scratch_, size_t(max_unpack) * pb, "the lossless13 unpack scratch");

  std::vector<SplitWork> work;
  std::vector<UnpackWork> unpack;
  jobs_.assign(size_t(n_jobs), Job{});
  bytes_per_step_ = 0;
  copies_per_step_ = 0;
  largest_copy_ = 0;
  // Work lists of job j for layer l with its pages at `stage` (streamed: a
  // slot of the ring; resident: null, pages at their pool offsets on the GPU).
  auto build_lists = [&](int64_t j, int l, const std::byte* stage) {
    Lists out;
    const int64_t e0 = j * job_pages_, e1 = std::min(E, e0 + job_pages_);
    std::vector<std::pair<const std::byte*, PageKind>> where;
    size_t off = 0;
    int n13 = 0;
    out.unpack.off = unpack.size();
    for (int64_t e = e0; e < e1; ++e) {
      const PageRef& r = ref(e, l);
      const std::byte* src = stage ? stage + off : dev_pool_ + r.offset;
      off += align_up(r.bytes);
      if (r.kind == PageKind::lossless13) {
        std::byte* dst = unpack_scratch_ + size_t(n13++) * pb;
        unpack.push_back(UnpackWork{src, dst, r.bytes});
        where.emplace_back(dst, PageKind::bf16);
      } else {
        where.emplace_back(src, r.kind);
      }
    }
    out.unpack.n = int(unpack.size() - out.unpack.off);
    for (PageKind k : {PageKind::bf16, PageKind::int8s}) {
      List& list = k == PageKind::bf16 ? out.bf16 : out.int8s;
      list.off = work.size();
      for (int64_t e = e0; e < e1; ++e) {
        if (where[size_t(e - e0)].second != k) continue;
        const Entry& en = entries[e];
        for (int k2 = 0; k2 < splits_per_page; ++k2) {
          const int64_t t0 = int64_t(k2) * sh.split_tokens;
          if (t0 >= en.valid) break;
          SplitWork w;
          w.page = where[size_t(e - e0)].first;
          w.seq = en.seq;
          w.tok0 = int32_t(t0);
          w.ntok = int32_t(std::min<int64_t>(sh.split_tokens, en.valid - t0));
          w.split = int32_t(en.page * splits_per_page + k2);
          work.push_back(w);
        }
      }
      list.n = int(work.size() - list.off);
    }
    return out;
  };
  for (int64_t j = 0; j < n_jobs; ++j) {
    Job& job = jobs_[j];
    const int64_t e0 = j * job_pages_, e1 = std::min(E, e0 + job_pages_);
    if (streamed) {
      for (int r = 0; r < cfg_.ring_slots; ++r)
        for (int l = 0; l < L; ++l) job.lists.push_back(build_lists(j, l, staging_ + size_t(r) * stage_slot_bytes_));
    } else {
      for (int l = 0; l < L; ++l) job.lists.push_back(build_lists(j, l, nullptr));
    }
    job.info.resize(L);
    if (streamed) job.runs.resize(L);
    for (int l = 0; l < L; ++l) {
      JobInfo& ji = job.info[l];
      const Lists& li = job.lists[size_t(l)];
      ji.n_work = li.bf16.n + li.int8s.n;
      size_t stage_off = 0;
      for (int64_t e = e0; e < e1; ++e) {
        const PageRef& r = ref(e, l);
        ji.tokens += entries[e].valid;
        ji.tokens_by_kind[int(r.kind)] += entries[e].valid;
        if (streamed) {
          std::vector<Run>& runs = job.runs[l];
          // One copy per run of pages that are back to back in the pool (and so in the
          // slot); a page's copy includes its padding to 256 bytes (< 0.01 % of a page).
          const size_t bytes = align_up(r.bytes);
          if (!runs.empty() && runs.back().host_off + runs.back().bytes == r.offset)
            runs.back().bytes += bytes;
          else
            runs.push_back({r.offset, stage_off, bytes});
        }
        stage_off += align_up(r.bytes);
      }
      if (streamed)
        for (const Run& r : job.runs[l]) {
          bytes_per_step_ += r.bytes;
          ++copies_per_step_;
          largest_copy_ = std::max(largest_copy_, r.bytes);
        }
    }
  }

  alloc(work_dev_, work.size(), "work lists");
  AKV_CUDA(cudaMemcpy(work_dev_, work.data(), work.size() * sizeof(SplitWork), cudaMemcpyHostToDevice));
  if (!unpack.empty()) {
    alloc(unpack_dev_, unpack.size(), "unpack lists");
    AKV_CUDA(cudaMemcpy(unpack_dev_, unpack.data(), unpack.size() * sizeof(UnpackWork), cudaMemcpyHostToDevice));
  }
  alloc(n_splits_dev_, n_splits.size(), "split counts");
  AKV_CUDA(cudaMemcpy(n_splits_dev_, n_splits.data(), n_splits.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  partials_.max_splits = max_splits;
  const size_t np_rows = size_t(n_seq_) * max_splits * sh.n_q_heads();
  alloc(partials_.o, np_rows * sh.head_dim, "partial outputs");
  alloc(partials_.lse, np_rows, "partial LSE");
  // Unused split slots must read as empty: fill LSE with -inf once.
  std::vector<float> ninf(np_rows, -__builtin_inff());
  AKV_CUDA(cudaMemcpy(partials_.lse, ninf.data(), np_rows * sizeof(float), cudaMemcpyHostToDevice));
  any_step_ = false;
  ready_ = true;
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
  std::byte* base = staging_ + size_t(slot) * stage_slot_bytes_;
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
  if (!ready_) throw InvalidArgument("DecodeEngine: no batch (call set_batch() first, and again after it failed)");
  if (any_step_) slot_base_ += int64_t(jobs_.size()) * cfg_.n_layers;
  any_step_ = true;
  jobs_enqueued_copy_ = 0;
  next_layer_ = 0;
}

void DecodeEngine::launch_job(const Lists& li, const float* q) {
  const AttnShape& sh = cfg_.attn;
  launch_unpack_lossless13(sh, unpack_dev_ + li.unpack.off, li.unpack.n, compute_);
  launch_split_attention(sh, work_dev_ + li.bf16.off, li.bf16.n, q, partials_, compute_);
  launch_split_attention_int8s(sh, work_dev_ + li.int8s.off, li.int8s.n, q, partials_, cfg_.int8s, compute_);
}

void DecodeEngine::enqueue_layer(int layer, const float* q, float* out, float* out_lse) {
  if (!ready_) throw InvalidArgument("DecodeEngine::enqueue_layer: no batch (call set_batch() first)");
  if (layer != next_layer_ || layer >= cfg_.n_layers)
    throw InvalidArgument("DecodeEngine::enqueue_layer: expected layer " +
                          (next_layer_ < cfg_.n_layers ? std::to_string(next_layer_) : std::string("none")) +
                          ", got " + std::to_string(layer) + " (call begin_step() before each step's layer 0)");
  ++next_layer_;
  const int64_t J = int64_t(jobs_.size());
  if (cfg_.mode == Mode::resident) {
    for (int64_t j = 0; j < J; ++j) launch_job(jobs_[j].lists[size_t(layer)], q);
  } else {
    for (int64_t j = 0; j < J; ++j) {
      const int64_t k = int64_t(layer) * J + j;
      ensure_copies(k + cfg_.ring_slots - 1);
      const int slot = int((slot_base_ + k) % cfg_.ring_slots);
      AKV_CUDA(cudaStreamWaitEvent(compute_, ev(events_copy_[slot]), 0));
      launch_job(jobs_[j].lists[size_t(slot) * cfg_.n_layers + layer], q);
      AKV_CUDA(cudaEventRecord(ev(events_compute_[slot]), compute_));
    }
  }
  launch_merge(cfg_.attn, partials_, n_splits_dev_, n_seq_, out, out_lse, compute_);
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
    JobInfo ji = j.info.at(size_t(layer));
    if (cfg_.mode == Mode::streamed)
      for (const Run& r : j.runs.at(size_t(layer))) ji.copy_bytes.push_back(r.bytes);
    out.push_back(std::move(ji));
  }
  return out;
}

void DecodeEngine::synchronize() {
  AKV_CUDA(cudaStreamSynchronize(copy_));
  AKV_CUDA(cudaStreamSynchronize(compute_));
}

}  // namespace activekv::cuda
