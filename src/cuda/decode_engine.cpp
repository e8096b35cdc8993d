// Decode engine: per-step plans, incremental work-list patches, streamed and
// resident jobs. See include/activekv/cuda/decode_engine.h.
#include "activekv/cuda/decode_engine.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "activekv/kv/codec.h"
#include "activekv/kv/head_shard.h"
#include "activekv/kv/int8s_layout.h"
#include "cpu_share.h"
#include "int8s_tc.h"
#include "cuda_check.h"
#include "device_buffer.h"
#include "activekv/cuda/patch.h"

namespace activekv::cuda {

// Every field of EngineConfig and of its parts. The sizes are x86-64's at
// the time of writing: a new field changes them, and the comparison below
// must then take it in (tests/cuda/test_engine_config_host.cpp, one change
// per field).
static_assert(sizeof(EngineConfig) == 136 && sizeof(AttnShape) == 32 && sizeof(Int8sKernelOptions) == 28 &&
                  sizeof(Int8sTcConfig) == 16 && sizeof(cpu::CpuAttentionOptions) == 16,
              "a field was added: compare it in same_engine_config");

bool same_engine_config(const EngineConfig& a, const EngineConfig& b) {
  const AttnShape &x = a.attn, &y = b.attn;
  const bool shape = x.n_kv_heads == y.n_kv_heads && x.group == y.group && x.head_dim == y.head_dim &&
                     x.page_size == y.page_size && x.split_tokens == y.split_tokens &&
                     x.softmax_scale == y.softmax_scale && x.kv_head0 == y.kv_head0 &&
                     x.page_kv_heads == y.page_kv_heads;
  const Int8sKernelOptions &i = a.int8s, &j = b.int8s;
  const bool int8s = i.kernel == j.kernel && i.query_terms == j.query_terms &&
                     i.skip_unit_rescale == j.skip_unit_rescale && i.pow2_reference == j.pow2_reference &&
                     i.tensor_cores == j.tensor_cores && i.tc.warps == j.tc.warps && i.tc.stages == j.tc.stages &&
                     i.tc.blocks == j.tc.blocks && i.tc.channel_rows == j.tc.channel_rows &&
                     i.tc.single_v == j.tc.single_v;
  const cpu::CpuAttentionOptions &c = a.cpu_kernels, &d = b.cpu_kernels;
  const bool cpu = c.threads == d.threads && c.split_tokens == d.split_tokens &&
                   c.int8s_query_terms == d.int8s_query_terms && c.isa == d.isa;
  return shape && int8s && cpu && a.n_layers == b.n_layers && a.tile_pages == b.tile_pages &&
         a.windows == b.windows && a.ring_slots == b.ring_slots && a.strided_copies == b.strided_copies &&
         a.compute_stream == b.compute_stream && a.overlap_formats == b.overlap_formats;
}
namespace {

cudaEvent_t ev(void* p) { return static_cast<cudaEvent_t>(p); }

constexpr size_t kStageAlign = 256;
size_t align_up(size_t x) { return (x + kStageAlign - 1) / kStageAlign * kStageAlign; }

// Checks a page table entry without reading a codec payload (the host
// validated the blob when it was encoded and published).
void check_page(const AttnShape& sh, const PageRef& r, int64_t needed, const std::string& where) {
  auto bad = [&](const std::string& m) {
    throw InvalidArgument("DecodeEngine::update: " + where + " (" + page_kind_name(r.kind) + " page): " + m);
  };
  if (!r.host && !(r.device && r.kind == PageKind::bf16)) bad("no host bytes (and not a bf16 page on the GPU)");
  if (reinterpret_cast<uintptr_t>(r.host) % 16 != 0 || reinterpret_cast<uintptr_t>(r.device) % 16 != 0)
    bad("not 16-byte aligned");
  if (r.cpu) {
    if (sh.sharded()) bad("marked for the CPU, which attends whole pages, not a head shard's heads");
    if (r.device) bad("marked for the CPU but has a device copy");
    if (r.kind == PageKind::lossless13) bad("the CPU does not attend lossless13 pages (bf16 and int8s only)");
    if (r.kind == PageKind::int8s && (!r.int8s_view || r.int8s_view->blob.data() != r.host))
      bad("an int8s page for the CPU needs the parsed view of its own blob (int8s_view)");
  }
  if (r.kind == PageKind::bf16) {
    if (r.bytes != sh.page_bytes())
      bad("bf16 page of " + std::to_string(r.bytes) + " bytes, the shape needs " + std::to_string(sh.page_bytes()));
    return;
  }
  if (r.bytes < kv::kCodecHeaderBytes) bad("shorter than the 64-byte codec header");
  const std::byte* b = r.host;
  auto u32 = [&](size_t off) { uint32_t v; std::memcpy(&v, b + off, 4); return v; };
  uint16_t fmt_id;
  std::memcpy(&fmt_id, b + 4, 2);
  const uint16_t want = uint16_t(r.kind == PageKind::int8s ? kv::CodecFormat::int8s : kv::CodecFormat::lossless13);
  if (u32(0) != kv::kCodecMagic) bad("bad magic (not a codec blob)");
  if (fmt_id != want) bad("blob holds format id " + std::to_string(fmt_id) + ", expected " + std::to_string(want));
  if (int(u32(8)) != sh.page_size || int(u32(12)) != sh.page_heads() || int(u32(16)) != sh.head_dim)
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
    const size_t want_bytes =
        kv::kCodecHeaderBytes + kv::Int8sSectionLayout{size_t(sh.head_dim), size_t(sh.page_size)}.payload_bytes(sh.page_heads());
    if (r.bytes != want_bytes)
      bad("an int8s page of this shape is " + std::to_string(want_bytes) + " bytes, the entry says " +
          std::to_string(r.bytes));
  }
  if (n_tok < needed) bad("holds " + std::to_string(n_tok) + " tokens, " + std::to_string(needed) + " are read");
  uint64_t payload;
  std::memcpy(&payload, b + 24, 8);
  if (payload != r.bytes - kv::kCodecHeaderBytes)
    bad("header payload of " + std::to_string(payload) + " bytes, the entry holds " +
        std::to_string(r.bytes - kv::kCodecHeaderBytes) + " after the header");
}

// The byte ranges of a stored page this shape's heads read (the whole page
// unless it is a head shard, activekv/kv/head_shard.h).
std::vector<kv::ByteRange> page_ranges(const AttnShape& sh, const PageRef& r) {
  if (!sh.sharded()) return {{0, r.bytes}};
  static_assert(int(PageKind::int8s) == int(kv::StoredPageKind::int8s) &&
                int(PageKind::lossless13) == int(kv::StoredPageKind::lossless13));
  return kv::shard_byte_ranges(kv::StoredPageKind(r.kind), r.host, r.bytes, sh.page_heads(), sh.page_size,
                               sh.head_dim, {sh.kv_head0, sh.n_kv_heads});
}

// A device allocation that grows by doubling; contents are not kept.
template <class T>
struct Grow {
  T* p = nullptr;
  size_t cap = 0;
  // True if it had to reallocate (the caller must then rewrite every entry).
  bool reserve(size_t n, const char* what) {
    if (n <= cap) return false;
    size_t c = std::max<size_t>(cap * 2, 16);
    while (c < n) c *= 2;
    cudaFree(p);
    p = nullptr;
    cap = 0;
    p = static_cast<T*>(device_malloc(c * sizeof(T), std::string("DecodeEngine: ") + what));
    cap = c;
    return true;
  }
  ~Grow() { cudaFree(p); }
};

}  // namespace

const char* page_kind_name(PageKind k) {
  switch (k) {
    case PageKind::bf16: return "bf16";
    case PageKind::int8s: return "int8s";
    case PageKind::lossless13: return "lossless13";
  }
  return "?";
}

// One job of one layer: the resident pages of the layer, or a tile of its
// streamed pages (copied into ring slot `slot`).
struct JobPlan {
  bool resident = false;
  int slot = -1;
  std::vector<kv::StagedCopy> runs;  // its copies (rows == 1: cudaMemcpyAsync, else cudaMemcpy2DAsync)
  struct List { size_t off = 0; int n = 0; };  // a slice of Plan::work / Plan::unpack
  List bf16, int8s, unpack;
  std::vector<size_t> entries;  // the layer's entries (see layer_entries) this job reads, in order
  DecodeEngine::JobInfo info;
};

// What update() computed: the batch, the jobs, and the device work lists as
// they must read for the next step.
struct DecodeEngine::Plan {
  std::vector<SeqPages> seqs;
  std::vector<std::vector<JobPlan>> jobs;  // [layer]
  std::vector<std::pair<int, int>> ring;   // streamed jobs in step order: (layer, job); job k uses slot k % R
  std::vector<SplitWork> work;
  std::vector<UnpackWork> unpack;
  std::vector<int32_t> n_splits;  // [layer][seq]
  std::vector<size_t> resident_bytes;  // [layer]
  std::vector<DecodeEngine::SeqFigures> figures;  // [seq]
  size_t stage_slot_bytes = 0;    // largest streamed job
  int max_unpack = 0;             // most lossless13 pages in one job
  int max_splits = 1;
  std::shared_ptr<CpuStepWork> cpu;  // the CPU's share; null when no page is marked `cpu`
};

// Device buffers; work/unpack/n_splits hold what the previous plan wrote.
struct DecodeEngine::Device {
  Grow<SplitWork> work;
  Grow<UnpackWork> unpack;
  Grow<int32_t> n_splits;
  Grow<std::byte> staging;       // ring_slots * slot_bytes
  Grow<std::byte> unpack_scratch;
  Grow<float> part_o, part_lse;
  size_t slot_bytes = 0;
  int cap_splits = 0, cap_seqs = 0;
  PatchBuffer patches;
  std::vector<Patch> pending;
  bool rewrite_all = true;  // device lists do not hold the previous plan
};

DecodeEngine::DecodeEngine(const EngineConfig& cfg) : cfg_(cfg), dev_(std::make_unique<Device>()) {
  cfg_.attn.validate();
  if (cfg_.n_layers <= 0) throw InvalidArgument("EngineConfig: n_layers must be positive");
  if (cfg_.tile_pages < 0) throw InvalidArgument("EngineConfig: tile_pages must be >= 0");
  if (cfg_.ring_slots < 2) throw InvalidArgument("EngineConfig: ring_slots must be >= 2");
  if (cfg_.int8s.kernel == Int8sKernel::tc && !int8s_tc_supports_group(cfg_.attn.group))
    throw InvalidArgument("EngineConfig: " + tc_group_error(cfg_.attn.group));
  if (cfg_.int8s.kernel == Int8sKernel::tc && cfg_.attn.split_tokens > kMaxTcSplit)  // else the first int8s page fails a step
    throw InvalidArgument("EngineConfig: the int8s tc kernel takes splits of at most " + std::to_string(kMaxTcSplit) +
                          " tokens, the shape has " + std::to_string(cfg_.attn.split_tokens));
  cfg_.int8s.kernel = resolve_int8s_kernel(cfg_.int8s.kernel, cfg_.attn);  // config() says which one runs
  if (!cfg_.windows.empty() && int(cfg_.windows.size()) != cfg_.n_layers)
    throw InvalidArgument("EngineConfig: windows has " + std::to_string(cfg_.windows.size()) + " entries, n_layers is " +
                          std::to_string(cfg_.n_layers));
  for (int w : cfg_.windows)
    if (w < 0) throw InvalidArgument("EngineConfig: a window must be >= 0 tokens, got " + std::to_string(w));
  if (cfg_.compute_stream) {
    compute_ = cfg_.compute_stream;
  } else {
    AKV_CUDA(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    own_compute_ = true;
  }
  AKV_CUDA(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  AKV_CUDA(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  for (void** e : {&fork_, &join_}) {
    cudaEvent_t x;
    AKV_CUDA(cudaEventCreateWithFlags(&x, cudaEventDisableTiming));
    *e = x;
  }
  for (int i = 0; i < cfg_.ring_slots; ++i) {
    cudaEvent_t a, b;
    AKV_CUDA(cudaEventCreateWithFlags(&a, cudaEventDisableTiming));
    AKV_CUDA(cudaEventCreateWithFlags(&b, cudaEventDisableTiming));
    events_copy_.push_back(a);
    events_compute_.push_back(b);
  }
}

DecodeEngine::~DecodeEngine() {
  if (compute_) cudaStreamSynchronize(compute_);
  if (copy_) cudaStreamSynchronize(copy_);
  cpu_.reset();  // its side stream writes into dev_'s partials
  dev_.reset();
  for (void* e : events_copy_) cudaEventDestroy(ev(e));
  for (void* e : events_compute_) cudaEventDestroy(ev(e));
  if (fork_) cudaEventDestroy(ev(fork_));
  if (join_) cudaEventDestroy(ev(join_));
  if (side_) cudaStreamDestroy(side_);
  if (compute_ && own_compute_) cudaStreamDestroy(compute_);
  if (copy_) cudaStreamDestroy(copy_);
}

namespace {

// The first key a layer with `window` (0: none) attends for a sequence of n
// tokens, whose query sits at n - 1.
int64_t first_visible(int64_t n, int window) { return window > 0 ? std::max<int64_t>(0, n - window) : 0; }

// Entries of one layer: (sequence, page index, first attended token in it,
// tokens valid in it), sequence-major, from the first visible page on.
struct Entry { int seq; int64_t page; int64_t lo; int64_t valid; };

std::vector<Entry> layer_entries(const std::vector<SeqPages>& seqs, int page_size, int window) {
  std::vector<Entry> out;
  for (int s = 0; s < int(seqs.size()); ++s) {
    const int64_t n = seqs[size_t(s)].n_tokens;
    const int64_t first = first_visible(n, window);
    for (int64_t p = first / page_size; p * page_size < n; ++p)
      out.push_back({s, p, std::max<int64_t>(0, first - p * page_size), std::min<int64_t>(page_size, n - p * page_size)});
  }
  return out;
}

// Splits a layer's merge takes for a sequence of n tokens: from the one
// holding its first visible token to the one holding token n - 1.
int32_t splits_of(int64_t n, int window, int split_tokens) {
  return n == 0 ? 0 : int32_t((n - 1) / split_tokens - first_visible(n, window) / split_tokens + 1);
}

// One layer's CPU pages (entries `idx`, sequence-major, page order) as
// per-sequence page lists and the split slots their partials go to.
// Splits are numbered as the GPU's work (from the layer's first visible
// split); the CPU attends whole pages from their first token, so a page a
// window starts inside stays on the GPU (InvalidArgument).
template <class Ref>
void plan_cpu_layer(const AttnShape& sh, const std::vector<SeqPages>& seqs, int window,
                    const std::vector<Entry>& entries, const std::vector<size_t>& idx, const Ref& ref,
                    CpuLayerWork& w, std::vector<DecodeEngine::SeqFigures>& figures) {
  const int per_page = sh.page_size / sh.split_tokens;
  const cpu::DecodeShape ds{sh.n_kv_heads, sh.group, sh.head_dim, sh.page_size, sh.softmax_scale};
  for (size_t e : idx) {
    const Entry& en = entries[e];
    const PageRef& r = ref(e);
    if (en.lo != 0)
      throw InvalidArgument("DecodeEngine::update: sequence " + std::to_string(en.seq) + " page " +
                            std::to_string(en.page) + " is marked for the CPU but its layer's window starts inside it");
    const int64_t split0 = first_visible(seqs[size_t(en.seq)].n_tokens, window) / sh.split_tokens;
    if (w.seqs.empty() || w.seqs.back().seq != en.seq) w.seqs.push_back({en.seq, {}, w.rows});
    const int valid = int(en.valid);
    w.seqs.back().pages.push_back(r.kind == PageKind::int8s ? cpu::PageRef::from_int8s(*r.int8s_view, valid)
                                                            : cpu::PageRef::from_bf16(reinterpret_cast<const bf16*>(r.host), valid));
    for (int t0 = 0; t0 < valid; t0 += sh.split_tokens) {
      const int32_t split = int32_t(en.page * per_page + t0 / sh.split_tokens - split0);
      auto& runs = w.runs;
      if (!runs.empty() && runs.back().seq == en.seq && runs.back().split0 + runs.back().count == split)
        ++runs.back().count;
      else
        runs.push_back({en.seq, split, 1, w.rows});
      ++w.rows;
    }
  }
  for (const auto& s : w.seqs) {
    const size_t bytes = cpu::history_bytes(ds, s.pages);
    w.bytes += bytes;
    figures[size_t(s.seq)].cpu += bytes;
  }
}

// Adds one byte range of a streamed page to its job's copies; returns the
// bytes and copy calls it added (extending the last copy adds no call).
std::pair<size_t, size_t> add_copy(std::vector<kv::StagedCopy>& runs, const std::byte* host, size_t stage,
                                   size_t bytes, bool strided) {
  const size_t n0 = runs.size(), last0 = runs.empty() ? 0 : runs.back().bytes();
  kv::add_staged_copy(runs, host, stage, bytes, strided, kStageAlign);
  if (runs.size() > n0) return {runs.back().bytes(), 1};
  return {runs.back().bytes() - last0, 0};
}

}  // namespace

void DecodeEngine::update(const std::vector<SeqPages>& seqs) {
  const AttnShape& sh = cfg_.attn;
  const int L = cfg_.n_layers;
  ready_ = false;
  if (seqs.empty()) throw InvalidArgument("DecodeEngine::update: empty batch");
  auto plan = std::make_unique<Plan>();
  Plan& P = *plan;
  const size_t n_seq = seqs.size();
  P.n_splits.resize(size_t(L) * n_seq);
  P.figures.assign(n_seq, SeqFigures{});
  for (size_t s = 0; s < seqs.size(); ++s) {
    const SeqPages& sp = seqs[s];
    const std::string name = "sequence " + std::to_string(s);
    if (sp.n_tokens < 0) throw InvalidArgument("DecodeEngine::update: " + name + " has n_tokens < 0");
    if (int(sp.tables.size()) != L)
      throw InvalidArgument("DecodeEngine::update: " + name + " has " + std::to_string(sp.tables.size()) +
                            " page tables, the model has " + std::to_string(L) + " layers");
    const int64_t np = (sp.n_tokens + sh.page_size - 1) / sh.page_size;
    const SeqPages* old = plan_ && s < plan_->seqs.size() ? &plan_->seqs[s] : nullptr;
    for (int l = 0; l < L; ++l) {
      const auto& t = sp.tables[size_t(l)];
      if (int64_t(t.size()) < np)
        throw InvalidArgument("DecodeEngine::update: " + name + " layer " + std::to_string(l) + " page table has " +
                              std::to_string(t.size()) + " pages, " + std::to_string(np) + " needed for " +
                              std::to_string(sp.n_tokens) + " tokens");
      for (int64_t p = first_visible(sp.n_tokens, window(l)) / sh.page_size; p < np; ++p) {
        const bool same = old && size_t(p) < old->tables[size_t(l)].size() && old->tables[size_t(l)][size_t(p)] == t[size_t(p)] &&
                          (p + 1) * sh.page_size <= old->n_tokens;  // was full then: nothing new to check
        if (!same)
          check_page(sh, t[size_t(p)], std::min<int64_t>(sh.page_size, sp.n_tokens - p * sh.page_size),
                     name + " layer " + std::to_string(l) + " page " + std::to_string(p));
      }
    }
    for (int l = 0; l < L; ++l) {
      const int32_t n = splits_of(sp.n_tokens, window(l), sh.split_tokens);
      if (n > kMaxMergeSplits)
        throw InvalidArgument("DecodeEngine::update: " + name + " has " + std::to_string(n) + " splits of " +
                              std::to_string(sh.split_tokens) + " tokens; the merge takes at most " +
                              std::to_string(kMaxMergeSplits) + " (use larger splits)");
      P.n_splits[size_t(l) * n_seq + s] = n;
      P.max_splits = std::max(P.max_splits, int(n));
    }
  }
  P.seqs = seqs;

  // Pass 1: the jobs of each layer (its resident pages; its streamed pages in
  // tiles) and their copies, in host memory order.
  std::vector<std::vector<Entry>> layer_ents(static_cast<size_t>(L));
  for (int l = 0; l < L; ++l) layer_ents[size_t(l)] = layer_entries(seqs, sh.page_size, window(l));
  auto ref = [&](size_t e, int l) -> const PageRef& {
    const Entry& en = layer_ents[size_t(l)][e];
    return seqs[size_t(en.seq)].tables[size_t(l)][size_t(en.page)];
  };
  P.jobs.resize(size_t(L));
  P.resident_bytes.assign(size_t(L), 0);
  for (int l = 0; l < L; ++l) {
    const std::vector<Entry>& entries = layer_ents[size_t(l)];
    std::vector<size_t> resident, streamed, on_cpu;  // indexes into entries
    for (size_t i = 0; i < entries.size(); ++i)
      (ref(i, l).cpu ? on_cpu : ref(i, l).device ? resident : streamed).push_back(i);
    if (!on_cpu.empty()) {
      if (!P.cpu) {
        P.cpu = std::make_shared<CpuStepWork>();
        P.cpu->layers.resize(size_t(L));
      }
      plan_cpu_layer(sh, seqs, window(l), entries, on_cpu, [&](size_t e) -> const PageRef& { return ref(e, l); },
                     P.cpu->layers[size_t(l)], P.figures);
      P.cpu->max_rows = std::max(P.cpu->max_rows, P.cpu->layers[size_t(l)].rows);
      P.cpu->bytes += P.cpu->layers[size_t(l)].bytes;
    }
    auto add_job = [&](std::vector<size_t> idx, bool res) {
      JobPlan j;
      j.resident = res;
      j.info.resident = res;
      if (!res) {
        j.slot = int(P.ring.size() % size_t(cfg_.ring_slots));
        P.ring.emplace_back(l, int(P.jobs[size_t(l)].size()));
      }
      size_t stage = 0;
      int n13 = 0;
      for (size_t e : idx) {
        const PageRef& r = ref(e, l);
        const int64_t tokens = entries[e].valid - entries[e].lo;
        j.info.tokens += tokens;
        j.info.tokens_by_kind[int(r.kind)] += tokens;
        n13 += r.kind == PageKind::lossless13;
        // The page's bytes this shape reads (a head shard: only its heads'),
        // staged at their offsets in the page, so the kernels address a
        // staged page as the stored one.
        const std::vector<kv::ByteRange> ranges = res && !sh.sharded() ? std::vector<kv::ByteRange>{{0, r.bytes}}
                                                                       : page_ranges(sh, r);
        SeqFigures& fig = P.figures[size_t(entries[e].seq)];
        if (res) {  // a windowed layer's first page: from its first visible token
          size_t mine = 0;
          for (const auto& b : ranges) mine += b.bytes;
          const size_t read = size_t(mine * uint64_t(sh.page_size - entries[e].lo) / uint64_t(sh.page_size));
          P.resident_bytes[size_t(l)] += read;
          fig.resident += read;
          if (window(l) > 0) fig.windowed_resident += read;
          continue;
        }
        // One copy per run of pages laid out in host memory as in the slot
        // (each page 256-byte aligned): the run also copies the padding
        // between its pages, never past its last page's bytes.
        for (const auto& b : ranges) {
          const auto [bytes, calls] = add_copy(j.runs, r.host + b.offset, stage + b.offset, b.bytes, cfg_.strided_copies);
          fig.streamed += bytes;
          fig.copies += calls;
        }
        stage += align_up(r.bytes);
      }
      for (const auto& run : j.runs) {
        j.info.copy_bytes.push_back(run.bytes());
        j.info.copy_rows.push_back(run.rows);
      }
      j.entries = std::move(idx);
      P.stage_slot_bytes = std::max(P.stage_slot_bytes, stage);
      P.max_unpack = std::max(P.max_unpack, n13);
      P.jobs[size_t(l)].push_back(std::move(j));
    };
    if (!resident.empty()) add_job(resident, true);
    const size_t per = cfg_.tile_pages == 0 ? std::max<size_t>(streamed.size(), 1) : size_t(cfg_.tile_pages);
    for (size_t b = 0; b < streamed.size(); b += per)
      add_job(std::vector<size_t>(streamed.begin() + std::ptrdiff_t(b),
                                  streamed.begin() + std::ptrdiff_t(std::min(streamed.size(), b + per))),
              false);
  }

  // Capacities (a growth reallocates: wait for the streams, rewrite every
  // entry). Sizes are recorded only once their buffer exists, and every
  // entry is rewritten after any reallocation, so a failed allocation (the
  // update throws) leaves nothing that claims room it does not have.
  Device& D = *dev_;
  const size_t slot_cap = cfg_.tile_pages > 0 ? size_t(cfg_.tile_pages) * align_up(sh.page_bytes()) : SIZE_MAX;
  const bool grow_slot = P.stage_slot_bytes > D.slot_bytes;
  const bool grow_parts = P.max_splits > D.cap_splits || int(seqs.size()) > D.cap_seqs;
  if (grow_slot || size_t(P.max_unpack) * sh.page_bytes() > D.unpack_scratch.cap || grow_parts) {
    synchronize();
    D.rewrite_all = true;
    if (grow_slot) {  // doubling (never beyond a full tile of bf16 pages): a growing history reallocates rarely
      const size_t slot = std::max(align_up(P.stage_slot_bytes), std::min(2 * D.slot_bytes, slot_cap));
      D.slot_bytes = 0;
      D.staging.reserve(size_t(cfg_.ring_slots) * slot, "the staging ring");
      D.slot_bytes = slot;
    }
    D.unpack_scratch.reserve(size_t(P.max_unpack) * sh.page_bytes(), "the lossless13 unpack scratch");
    if (grow_parts) {
      const int splits = std::min(std::max(P.max_splits, D.cap_splits * 2), kMaxMergeSplits);
      const int n_seqs = std::max(int(seqs.size()), D.cap_seqs);
      const size_t rows = size_t(n_seqs) * size_t(splits) * size_t(sh.n_q_heads());
      D.cap_splits = D.cap_seqs = 0;
      D.part_o.reserve(rows * size_t(sh.head_dim), "partial outputs");
      D.part_lse.reserve(rows, "partial LSE");
      D.cap_splits = splits;
      D.cap_seqs = n_seqs;
    }
  }

  // Pass 2: the work lists with device addresses (a job's pages at their
  // resident copy, or at their place in the job's ring slot; lossless13
  // pages at their unpacked place in the scratch).
  for (int l = 0; l < L; ++l) {
    const std::vector<Entry>& entries = layer_ents[size_t(l)];
    for (JobPlan& j : P.jobs[size_t(l)]) {
      std::vector<std::pair<const void*, PageKind>> where;  // the page as the kernels read it
      const std::byte* slot = j.resident ? nullptr : D.staging.p + size_t(j.slot) * D.slot_bytes;
      size_t stage = 0;
      int n13 = 0;
      j.unpack.off = P.unpack.size();
      for (size_t e : j.entries) {
        const PageRef& r = ref(e, l);
        const void* src = j.resident ? r.device : static_cast<const void*>(slot + stage);
        stage += align_up(r.bytes);
        if (r.kind == PageKind::lossless13) {
          std::byte* dst = D.unpack_scratch.p + size_t(n13++) * sh.page_bytes();
          P.unpack.push_back(UnpackWork{src, dst, r.bytes});
          where.emplace_back(dst, PageKind::bf16);
        } else {
          where.emplace_back(src, r.kind);
        }
      }
      j.unpack.n = int(P.unpack.size() - j.unpack.off);
      for (PageKind want : {PageKind::bf16, PageKind::int8s}) {
        JobPlan::List& list = want == PageKind::bf16 ? j.bf16 : j.int8s;
        list.off = P.work.size();
        for (size_t k = 0; k < j.entries.size(); ++k) {
          if (where[k].second != want) continue;
          const Entry& en = entries[j.entries[k]];
          // Splits at fixed token positions (multiples of split_tokens), the
          // first one of a windowed layer starting at its first visible
          // token; numbered from the layer's first visible split.
          const int64_t split0 = first_visible(seqs[size_t(en.seq)].n_tokens, window(l)) / sh.split_tokens;
          for (int64_t t0 = en.lo; t0 < en.valid;) {
            const int64_t end = std::min<int64_t>(en.valid, (t0 / sh.split_tokens + 1) * sh.split_tokens);
            SplitWork w;
            w.page = where[k].first;
            w.seq = en.seq;
            w.tok0 = int32_t(t0);
            w.ntok = int32_t(end - t0);
            w.split = int32_t(en.page * (sh.page_size / sh.split_tokens) + t0 / sh.split_tokens - split0);
            P.work.push_back(w);
            t0 = end;
          }
        }
        list.n = int(P.work.size() - list.off);
      }
      j.info.n_work = j.bf16.n + j.int8s.n;
    }
  }
  if (P.cpu || cpu_) {
    if (!cpu_) {
      cpu::CpuAttentionOptions o = cfg_.cpu_kernels;
      o.split_tokens = sh.split_tokens;
      o.int8s_query_terms = cfg_.int8s.query_terms;
      cpu_ = std::make_unique<CpuShare>(sh, o);
    }
    cpu_->set_work(P.cpu ? P.cpu : std::make_shared<CpuStepWork>(), int(seqs.size()));
  }
  apply(std::move(plan));
}

// Writes the plan's work lists to the device: every entry after a
// reallocation, else only those that differ from the previous plan.
void DecodeEngine::apply(std::unique_ptr<Plan> plan) {
  Device& D = *dev_;
  const Plan& P = *plan;
  if (P.work.size() > D.work.cap || P.unpack.size() > D.unpack.cap || P.n_splits.size() > D.n_splits.cap) {
    synchronize();  // the old lists may still be read by queued kernels
    D.rewrite_all = true;
    D.work.reserve(P.work.size(), "work lists");
    D.unpack.reserve(P.unpack.size(), "unpack lists");
    D.n_splits.reserve(P.n_splits.size(), "split counts");
  }
  const Plan* old = D.rewrite_all || !plan_ ? nullptr : plan_.get();
  std::vector<Patch>& out = D.pending;
  out.clear();
  auto diff = [&](const auto& want, const auto* have, auto* dev) {
    for (size_t i = 0; i < want.size(); ++i) {
      if (have && i < have->size() && std::memcmp(&(*have)[i], &want[i], sizeof(want[i])) == 0) continue;
      out.push_back(make_patch(dev + i, &want[i], sizeof(want[i])));
    }
  };
  diff(P.work, old ? &old->work : nullptr, D.work.p);
  diff(P.unpack, old ? &old->unpack : nullptr, D.unpack.p);
  diff(P.n_splits, old ? &old->n_splits : nullptr, D.n_splits.p);
  last_patches_ = out.size();
  D.patches.submit(out, compute_);  // one scatter kernel, ordered before the step's kernels
  D.rewrite_all = false;

  bytes_per_step_ = copies_per_step_ = largest_copy_ = resident_bytes_per_step_ = copy_rows_per_step_ = 0;
  layer_streamed_.assign(P.jobs.size(), 0);
  layer_resident_ = P.resident_bytes;
  for (size_t l = 0; l < P.jobs.size(); ++l) {
    for (const JobPlan& j : P.jobs[l])
      for (const auto& r : j.runs) {
        layer_streamed_[l] += r.bytes();
        ++copies_per_step_;
        copy_rows_per_step_ += r.rows;
        largest_copy_ = std::max(largest_copy_, r.bytes());
      }
    bytes_per_step_ += layer_streamed_[l];
    resident_bytes_per_step_ += layer_resident_[l];
  }
  plan_ = std::move(plan);
  ready_ = true;
  next_layer_ = cfg_.n_layers;  // begin_step() first
}

void DecodeEngine::begin_step() {
  if (!ready_) throw InvalidArgument("DecodeEngine: no batch (call update() first, and again after it failed)");
  if (cpu_) cpu_->rethrow_error();
  next_layer_ = 0;
  ring_job_ = 0;
  copies_enqueued_ = 0;
}

// Copies streamed job k of the step into ring slot k % R, after the attention
// that last read that slot.
void DecodeEngine::enqueue_copy(int64_t k) {
  const auto [layer, job] = plan_->ring[size_t(k)];
  const JobPlan& j = plan_->jobs[size_t(layer)][size_t(job)];
  std::byte* base = dev_->staging.p + size_t(j.slot) * dev_->slot_bytes;
  AKV_CUDA(cudaStreamWaitEvent(copy_, ev(events_compute_[size_t(j.slot)]), 0));
  for (const auto& r : j.runs) {
    if (r.rows == 1)
      AKV_CUDA(cudaMemcpyAsync(base + r.stage_off, r.host, r.width, cudaMemcpyHostToDevice, copy_));
    else
      AKV_CUDA(cudaMemcpy2DAsync(base + r.stage_off, r.pitch, r.host, r.pitch, r.width, r.rows,
                                 cudaMemcpyHostToDevice, copy_));
  }
  AKV_CUDA(cudaEventRecord(ev(events_copy_[size_t(j.slot)]), copy_));
}

void DecodeEngine::launch_job(const JobPlan& j, const float* q) {
  const AttnShape& sh = cfg_.attn;
  const Device& D = *dev_;
  const Partials parts{D.part_o.p, D.part_lse.p, D.cap_splits};
  launch_unpack_lossless13(sh, D.unpack.p + j.unpack.off, j.unpack.n, compute_);
  // Both kinds (the hybrid route): the bf16 kernel stays on the compute
  // stream (after the unpack, whose pages it reads) and the int8s kernel
  // goes on the side stream behind an event, so the bf16 kernel is the one
  // the GPU sees first. Its few CTAs (108 KiB of shared memory each for
  // head_dim 256) must be placed before the int8s kernel fills the SMs:
  // placed after, they waited for the int8s kernel to drain (the H200
  // sweep at b0220f2, bf16 on a high-priority side stream: hybrid at 32K
  // = the serialised time with 38 KiB int8s CTAs, which free too little
  // at a time for a bf16 CTA). Joined before the merge.
  const bool fork = cfg_.overlap_formats && j.bf16.n > 0 && j.int8s.n > 0;
  if (fork) {
    AKV_CUDA(cudaEventRecord(ev(fork_), compute_));
    AKV_CUDA(cudaStreamWaitEvent(side_, ev(fork_), 0));
  }
  launch_split_attention(sh, D.work.p + j.bf16.off, j.bf16.n, q, parts, compute_);
  launch_split_attention_int8s(sh, D.work.p + j.int8s.off, j.int8s.n, q, parts, cfg_.int8s, fork ? side_ : compute_);
  if (fork) {
    AKV_CUDA(cudaEventRecord(ev(join_), side_));
    AKV_CUDA(cudaStreamWaitEvent(compute_, ev(join_), 0));
  }
}

void DecodeEngine::enqueue_layer(int layer, const float* q, float* out, float* out_lse, Int8Blocks out_int8) {
  if (!ready_) throw InvalidArgument("DecodeEngine::enqueue_layer: no batch (call update() first)");
  if (layer != next_layer_ || layer >= cfg_.n_layers)
    throw InvalidArgument("DecodeEngine::enqueue_layer: expected layer " +
                          (next_layer_ < cfg_.n_layers ? std::to_string(next_layer_) : std::string("none")) +
                          ", got " + std::to_string(layer) + " (call begin_step() before each step's layer 0)");
  ++next_layer_;
  const Device& D = *dev_;
  const Partials parts{D.part_o.p, D.part_lse.p, D.cap_splits};
  const bool cpu_work = cpu_ && cpu_->has_work(layer);
  if (cpu_work) cpu_->start_layer(layer, q, parts, compute_);  // first: the CPU starts as soon as q is ready
  const int64_t n_ring = int64_t(plan_->ring.size());
  for (const JobPlan& j : plan_->jobs[size_t(layer)]) {
    if (!j.resident) {
      // Keep up to R-1 copies in flight ahead of this job (into other slots).
      while (copies_enqueued_ < std::min(n_ring, ring_job_ + cfg_.ring_slots)) enqueue_copy(copies_enqueued_++);
      AKV_CUDA(cudaStreamWaitEvent(compute_, ev(events_copy_[size_t(j.slot)]), 0));
    }
    launch_job(j, q);
    if (!j.resident) {
      AKV_CUDA(cudaEventRecord(ev(events_compute_[size_t(j.slot)]), compute_));
      ++ring_job_;
    }
  }
  if (cpu_work) cpu_->join_layer(compute_);
  const size_t n_seq = plan_->seqs.size();
  launch_merge(cfg_.attn, parts, D.n_splits.p + size_t(layer) * n_seq, int(n_seq), out, out_lse, compute_,
               out_int8);
}

void DecodeEngine::enqueue_step(const float* q, float* out, float* out_lse) {
  begin_step();
  const size_t per_layer = plan_->seqs.size() * size_t(cfg_.attn.n_q_heads());
  for (int l = 0; l < cfg_.n_layers; ++l)
    enqueue_layer(l, q + per_layer * cfg_.attn.head_dim * l, out + per_layer * cfg_.attn.head_dim * l,
                  out_lse ? out_lse + per_layer * l : nullptr);
}

int DecodeEngine::jobs_in_layer(int layer) const {
  return plan_ ? int(plan_->jobs.at(size_t(layer)).size()) : 0;
}

std::vector<DecodeEngine::JobInfo> DecodeEngine::job_info(int layer) const {
  std::vector<JobInfo> out;
  if (plan_)
    for (const JobPlan& j : plan_->jobs.at(size_t(layer))) out.push_back(j.info);
  return out;
}

void DecodeEngine::check_cpu_error() {
  if (cpu_) cpu_->rethrow_error();
}

void DecodeEngine::synchronize() {
  AKV_CUDA(cudaStreamSynchronize(copy_));
  AKV_CUDA(cudaStreamSynchronize(compute_));
  if (cpu_) cpu_->synchronize();
}

const DecodeEngine::SeqFigures& DecodeEngine::sequence_figures(size_t seq) const {
  if (!ready_ || seq >= plan_->figures.size())
    throw InvalidArgument("DecodeEngine::sequence_figures: sequence " + std::to_string(seq) + " is not in the batch (" +
                          std::to_string(ready_ ? plan_->figures.size() : 0) + " sequences)");
  return plan_->figures[seq];
}

size_t DecodeEngine::cpu_bytes_per_step() const { return cpu_ ? cpu_->bytes_per_step() : 0; }
DecodeEngine::CpuTiming DecodeEngine::cpu_timing() const { return cpu_ ? cpu_->timing() : CpuTiming{}; }
void DecodeEngine::reset_cpu_timing() {
  if (cpu_) cpu_->reset_timing();
}

}  // namespace activekv::cuda
