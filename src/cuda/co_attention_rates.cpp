// Measurement of the co-attention rates: see
// include/activekv/cuda/co_attention_rates.h.
#include "activekv/cuda/co_attention_rates.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>
#include <tuple>
#include <vector>

#include "activekv/cpu/decode_attention.h"
#include "activekv/cuda/decode_engine.h"
#include "activekv/cuda/device_pages.h"
#include "activekv/kv/codec_int8s.h"
#include "activekv/kv/page_store.h"
#include "cuda_check.h"
#include "device_buffer.h"

namespace activekv::cuda {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kCopyBytes = size_t(64) << 20;
constexpr int kCopySources = 8;  // 512 MiB of sources in turn: a source the caches hold would hide the contention

// The calibration's bf16 history: 256 MiB, or ACTIVEKV_COATT_HISTORY_MIB
// (64..16384; an A/B switch). On an H100 host (ab036f5) the probes priced the
// CPU at 131 and 102 GB/s with the link busy (two runs) where the sweep's
// steps then read 90-100 (bench/results/h100_bench_decode_cpu_share_sweep_
// ab036f5_run*.json): shares at or past the planner's own were predicted up
// to 23 % short. The probes read 256 MiB a step, three times over (CPU pages
// and, by DMA, twice as many streamed ones from the same pages); a last-level
// cache holding a share of that would make exactly this error, which a larger
// history tells apart (bench/gpu/coatt_history_ab.sh). It did not, on another
// H100 host at 160e8d3 (h100_coatt_history_ab_160e8d3.json): 256 MiB predicted
// within 5 %, 2 GiB 1-9 % over; the rate's spread between fresh processes
// (67-104 GB/s) is the larger error (docs/co-attention.md).
size_t calibration_history_bytes() {
  static const size_t bytes = [] {
    const char* e = std::getenv("ACTIVEKV_COATT_HISTORY_MIB");
    if (!e || !*e) return size_t(256) << 20;
    char* end = nullptr;
    const long mib = std::strtol(e, &end, 10);
    if (*end != '\0' || mib < 64 || mib > 16384)
      throw InvalidArgument(fmt::format("ACTIVEKV_COATT_HISTORY_MIB: '{}' is not a whole number of MiB in 64..16384", e));
    return size_t(mib) << 20;
  }();
  return bytes;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Pinned host memory freed on scope exit.
struct Pinned {
  void* p = nullptr;
  explicit Pinned(size_t bytes) {
    const cudaError_t st = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (st != cudaSuccess) {
      (void)cudaGetLastError();
      throw CudaError(fmt::format("co-attention calibration: pinning {} bytes failed: {}", bytes, cudaGetErrorString(st)));
    }
  }
  ~Pinned() { cudaFreeHost(p); }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
};

// Random bf16 history of unit scale (finite, as real K/V).
void fill_history(bf16* p, size_t n) {
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    p[i] = f32_to_bf16(float(int64_t(x >> 40) - (int64_t(1) << 23)) / float(1 << 23));
  }
}

// The link alone: 64 MiB copies back to back, from 8 sources in turn, for
// `seconds`. GB/s.
double copy_loop(const void* host, void* dev, cudaStream_t s, double seconds) {
  size_t bytes = 0;
  int next = 0;
  const auto t0 = Clock::now();
  do {
    for (int i = 0; i < 4; ++i, next = (next + 1) % kCopySources)
      AKV_CUDA(cudaMemcpyAsync(dev, static_cast<const std::byte*>(host) + size_t(next) * kCopyBytes, kCopyBytes,
                               cudaMemcpyHostToDevice, s));
    AKV_CUDA(cudaStreamSynchronize(s));
    bytes += 4 * kCopyBytes;
  } while (seconds_since(t0) < seconds);
  return double(bytes) / seconds_since(t0) / 1e9;
}

// The CPU kernel alone over `pages`, call after call, for `seconds`. GB/s of
// history. (Reported beside the planner's rates, not priced: one call over
// the whole history runs faster than a decode step's layer tasks -- 99 GB/s
// against the engine's 66-79 on the H200 host at a5be516.)
double cpu_loop(const cpu::DecodeShape& ds, const std::vector<cpu::PageRef>& pages, const cpu::CpuAttentionOptions& o,
                double seconds) {
  std::vector<float> q(size_t(ds.n_q_heads()) * size_t(ds.head_dim), 0.5f), out(q.size()), lse(size_t(ds.n_q_heads()));
  cpu::CpuAttentionWorkspace ws;
  const size_t per_call = cpu::history_bytes(ds, pages);
  cpu::attend_pages(ds, pages, q.data(), o, ws, out.data(), lse.data());  // warm: workspace, first touch
  size_t bytes = 0;
  const auto t0 = Clock::now();
  do {
    cpu::attend_pages(ds, pages, q.data(), o, ws, out.data(), lse.data());
    bytes += per_call;
  } while (seconds_since(t0) < seconds);
  return double(bytes) / seconds_since(t0) / 1e9;
}

// The decode engine itself running co-attention steps: kProbeLayers layers,
// each with CPU pages (the oldest) and streamed bf16 pages, steps apart as a
// decode loop runs them. Per layer: the CPU's time inside its attention, the
// idle time between one layer's CPU task and the next's, the step's wall
// time, and the bytes of each path.
constexpr int kProbeLayers = 4;
struct EngineProbe {
  double busy_ms = 0;         ///< CPU attention, per layer
  double idle_ms = 0;         ///< between two layers' CPU tasks, per transition
  double step_ms = 0;         ///< wall time of a step, per layer
  double cpu_bytes = 0;       ///< per layer
  double streamed_bytes = 0;  ///< per layer
};

EngineProbe probe_engine(const AttnShape& sh, const std::vector<std::vector<PageRef>>& tables,
                         const cpu::CpuAttentionOptions& o) {
  constexpr int kWarmup = 3, kSteps = 20;
  const int L = int(tables.size());
  EngineConfig ec;
  ec.n_layers = L;
  ec.attn = sh;
  ec.cpu_kernels = o;
  DecodeEngine engine(ec);
  SeqPages seq;
  seq.n_tokens = int64_t(tables[0].size()) * sh.page_size;
  seq.tables = tables;
  engine.update({seq});
  const size_t q_floats = size_t(L) * size_t(sh.n_q_heads()) * size_t(sh.head_dim);  // [layer][head][dim]
  DevBuf q(q_floats * sizeof(float), "co-attention calibration: probe q");
  DevBuf out(q_floats * sizeof(float), "co-attention calibration: probe out");
  AKV_CUDA(cudaMemset(q.p, 0, q_floats * sizeof(float)));
  double wall_ms = 0;
  for (int i = 0; i < kWarmup + kSteps; ++i) {
    if (i == kWarmup) engine.reset_cpu_timing();
    const auto t0 = Clock::now();
    engine.enqueue_step(static_cast<const float*>(q.p), static_cast<float*>(out.p), nullptr);
    engine.synchronize();  // steps apart, as a decode loop runs them: only the idle inside a step counts
    if (i >= kWarmup) wall_ms += 1e3 * seconds_since(t0);
  }
  const DecodeEngine::CpuTiming t = engine.cpu_timing();
  EngineProbe p;
  const double layers = double(std::max<size_t>(t.layers, 1));
  p.busy_ms = t.busy_ms / layers;
  p.idle_ms = t.layers > t.steps ? t.idle_ms / double(t.layers - t.steps) : 0.0;
  p.step_ms = wall_ms / (double(kSteps) * double(L));
  p.cpu_bytes = double(t.bytes) / layers;
  for (const PageRef& r : tables[0]) p.streamed_bytes += r.cpu ? 0.0 : double(r.bytes);
  return p;
}

// A layer's CPU time as bytes / rate + a fixed part, from a small and a large
// probe (the same link load per CPU byte): the slope is the rate the CPU
// reads history at with the link busy, the intercept what a layer task costs
// beyond its bytes (its threads' start and the wait for the last item). If
// noise hides the slope, the large probe's mean rate and no fixed part.
struct CpuFit {
  double gbps = 0, fixed_ms = 0;
};
CpuFit fit_cpu(const EngineProbe& small, const EngineProbe& large) {
  const double db = large.cpu_bytes - small.cpu_bytes, dt = large.busy_ms - small.busy_ms;
  const double mean = large.cpu_bytes / (large.busy_ms * 1e6);
  if (!(db > 0 && dt > 0)) return {mean, 0.0};
  const double gbps = db / (dt * 1e6);
  // A slope far from the mean rate is noise in a small dt (tiny test pages:
  // tens of microseconds, like the threads' wake-up), not a rate: a huge one
  // would give the CPU every page. The mean then, and no fixed part.
  if (!(gbps >= 0.5 * mean && gbps <= 3 * mean)) return {mean, 0.0};
  return {gbps, std::max(0.0, small.busy_ms - small.cpu_bytes / (gbps * 1e6))};
}

// The link's rate while the CPU reads, from a probe whose link outlasts its
// CPU share in every layer: the link moves its bytes at that rate for the
// CPU's busy time and at `link_alone` for the rest of the layer (the
// planner's two-phase model, route/co_attention_plan.h). Bounded to
// [0.5, 1] x the rate alone, so that a noisy probe cannot price the link at
// nothing.
double link_with_cpu(const EngineProbe& p, double link_alone) {
  const double c = p.busy_ms, T = p.step_ms;
  if (!(T > 0)) return link_alone;
  const double gbps = T > c && c > 0 ? (p.streamed_bytes / 1e6 - (T - c) * link_alone) / c
                                     : p.streamed_bytes / (T * 1e6);
  return std::clamp(gbps, 0.5 * link_alone, link_alone);
}

// The GPU over resident pages as the decode engine reads them: one layer
// of the shape, every page of `table` with a device copy, step after step for
// `seconds`. GB/s of history read in place (DecodeEngine::resident_bytes_per_step).
double resident_rate(const AttnShape& sh, std::vector<PageRef> table, double seconds) {
  // One sequence's splits go through one merge: small pages (a test model's
  // 16 tokens: 256 MiB is 32768 pages) would pass its kMaxMergeSplits.
  const size_t splits_per_page = size_t(std::max(1, sh.page_size / sh.split_tokens));
  table.resize(std::min(table.size(), size_t(kMaxMergeSplits) / splits_per_page));
  EngineConfig ec;
  ec.n_layers = 1;
  ec.attn = sh;
  ec.tile_pages = 0;
  DecodeEngine engine(ec);
  uint64_t largest = 0;
  for (const PageRef& r : table) largest = std::max(largest, r.bytes);
  ResidentPages resident(size_t(largest), table.size());
  SeqPages seq;
  seq.n_tokens = int64_t(table.size()) * sh.page_size;
  seq.tables = {table};
  engine.update(resident.place({seq}));
  const size_t q_floats = size_t(sh.n_q_heads()) * size_t(sh.head_dim);
  DevBuf q(q_floats * sizeof(float), "co-attention calibration: resident q");
  DevBuf out(q_floats * sizeof(float), "co-attention calibration: resident out");
  AKV_CUDA(cudaMemset(q.p, 0, q_floats * sizeof(float)));
  engine.enqueue_step(static_cast<const float*>(q.p), static_cast<float*>(out.p), nullptr);  // warm-up
  engine.synchronize();
  size_t steps = 0;
  const auto t0 = Clock::now();
  do {
    for (int i = 0; i < 10; ++i, ++steps)
      engine.enqueue_step(static_cast<const float*>(q.p), static_cast<float*>(out.p), nullptr);
    engine.synchronize();
  } while (seconds_since(t0) < seconds);
  return double(engine.resident_bytes_per_step()) * double(steps) / seconds_since(t0) / 1e9;
}

}  // namespace

std::vector<route::PlanPage> plan_pages(const std::vector<PageRef>& table) {
  std::vector<route::PlanPage> out;
  out.reserve(table.size());
  for (const PageRef& r : table)
    out.push_back({r.bytes,
                   r.kind == PageKind::bf16    ? route::PlanPage::bf16
                   : r.kind == PageKind::int8s ? route::PlanPage::int8s
                                               : route::PlanPage::other,
                   r.device != nullptr});
  return out;
}

std::string CoAttentionCalibration::describe() const {
  return fmt::format("link {:.1f} GB/s alone, {:.1f} with the CPU busy; CPU bf16 {:.1f} / {:.1f}, int8s {:.1f} / {:.1f} "
                     "GB/s (one call alone / the engine's layer tasks with the link busy; {} threads, {:.0f} MiB of "
                     "history); CPU round trip between layers {:.3f} ms, a task's fixed cost bf16 {:.3f}, int8s {:.3f} ms; "
                     "GPU resident bf16 {:.0f}, int8s {:.0f} GB/s",
                     link_alone_gbps, together.link_gbps, cpu_bf16_alone_gbps, together.cpu_bf16_gbps,
                     cpu_int8s_alone_gbps, together.cpu_int8s_gbps, together.cpu_threads,
                     double(history_bytes) / double(1 << 20), together.cpu_layer_latency_ms,
                     together.cpu_bf16_task_ms, together.cpu_int8s_task_ms, together.resident_bf16_gbps, together.resident_int8s_gbps);
}

CoAttentionCalibration measure_co_attention_rates(const AttnShape& sh, int cpu_threads, double seconds) {
  sh.validate();
  if (cpu_threads <= 0) throw InvalidArgument("co-attention calibration: cpu_threads must be positive");
  const kv::KvShape ks{1, sh.n_kv_heads, sh.head_dim, sh.page_size, kv::PageFormat::bf16};
  const cpu::DecodeShape ds{sh.n_kv_heads, sh.group, sh.head_dim, sh.page_size, sh.softmax_scale};
  cpu::CpuAttentionOptions o;
  o.threads = cpu_threads;
  o.split_tokens = sh.split_tokens;

  const size_t n_pages = std::max<size_t>(8, (calibration_history_bytes() + sh.page_bytes() - 1) / sh.page_bytes());
  Pinned history(n_pages * sh.page_bytes());
  bf16* h = static_cast<bf16*>(history.p);
  fill_history(h, n_pages * ks.page_elements());
  std::vector<kv::EncodedPage> blobs(n_pages);
  std::vector<kv::Int8sPageView> views(n_pages);
  std::vector<cpu::PageRef> bf16_pages, int8s_pages;
  auto page_of = [&](size_t p) { return std::span<const bf16>(h + p * ks.page_elements(), ks.page_elements()); };
  {  // encode and validate on every core: the int8s half is the encoding of the bf16 half
    std::atomic<size_t> next{0};
    std::vector<std::thread> pool;
    std::exception_ptr err;
    std::mutex err_mutex;
    auto work = [&] {
      try {
        for (size_t p = next++; p < n_pages; p = next++) {
          blobs[p] = kv::encode_int8s_page(ks, page_of(p), sh.page_size);
          views[p] = kv::parse_int8s_page(blobs[p]);
        }
      } catch (...) {
        const std::lock_guard<std::mutex> lock(err_mutex);
        err = std::current_exception();
      }
    };
    for (int t = 1; t < cpu_threads; ++t) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    if (err) std::rethrow_exception(err);
  }
  for (size_t p = 0; p < n_pages; ++p) bf16_pages.push_back(cpu::PageRef::from_bf16(page_of(p).data(), sh.page_size));
  for (const kv::Int8sPageView& v : views) int8s_pages.push_back(cpu::PageRef::from_int8s(v, sh.page_size));

  Pinned src(kCopySources * kCopyBytes);
  std::memset(src.p, 1, kCopySources * kCopyBytes);
  DevBuf dst(kCopyBytes, "co-attention calibration: copy target");
  cudaStream_t s = nullptr;
  AKV_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const std::unique_ptr<CUstream_st, void (*)(cudaStream_t)> stream(s, [](cudaStream_t x) { cudaStreamDestroy(x); });

  CoAttentionCalibration c;
  c.together.cpu_threads = cpu_threads;
  c.history_bytes = n_pages * sh.page_bytes();
  copy_loop(src.p, dst.p, s, 0.02);  // warm-up
  c.link_alone_gbps = copy_loop(src.p, dst.p, s, seconds);
  c.cpu_bf16_alone_gbps = cpu_loop(ds, bf16_pages, o, seconds);
  c.cpu_int8s_alone_gbps = cpu_loop(ds, int8s_pages, o, seconds);

  // The engine's co-attention steps: per layer n CPU pages (distinct pages
  // in every layer: a working set past the caches) and 2n streamed bf16
  // pages, so that the link outlasts the CPU and the CPU always reads with
  // the link busy. Two sizes, a quarter and all of the history over the
  // probe's layers (at most 512 CPU pages a layer: small test pages would
  // pass the merge's split limit).
  const size_t large_n = std::clamp<size_t>(n_pages / kProbeLayers, 4, 512), small_n = std::max<size_t>(1, large_n / 4);
  auto tables = [&](bool int8s, size_t n, size_t streamed) {
    std::vector<std::vector<PageRef>> t(kProbeLayers);
    for (size_t l = 0; l < t.size(); ++l) {
      for (size_t i = 0; i < n; ++i) {
        const size_t p = (l * n + i) % n_pages;
        PageRef r = int8s ? PageRef{blobs[p].bytes.data(), nullptr, blobs[p].bytes.size(), PageKind::int8s}
                          : PageRef{reinterpret_cast<const std::byte*>(page_of(p).data()), nullptr, sh.page_bytes(),
                                    PageKind::bf16};
        r.cpu = true;
        if (int8s) r.int8s_view = &views[p];
        t[l].push_back(r);
      }
      for (size_t i = 0; i < streamed; ++i)  // pages another layer's CPU task reads, not this one's
        t[l].push_back(PageRef{reinterpret_cast<const std::byte*>(page_of((l * n + n * kProbeLayers / 2 + i) % n_pages).data()),
                               nullptr, sh.page_bytes(), PageKind::bf16});
    }
    return t;
  };
  // The engine takes int8s pages only at page sizes that are multiples of 16
  // (its int8s kernel's tile): elsewhere no int8s page is ever read in a
  // step, so its probes are skipped -- the CPU's one-call rate stands in and
  // the resident rate stays 0, "not measured" -- rather than failing the
  // whole calibration.
  const bool engine_int8s = sh.page_size % 16 == 0;
  auto keep = [&c](const char* name, const EngineProbe& p) {
    c.probes.push_back({name, p.cpu_bytes, p.streamed_bytes, p.busy_ms, p.idle_ms, p.step_ms});
    return p;
  };
  const EngineProbe bf16_small = keep("bf16 small", probe_engine(sh, tables(false, small_n, 2 * small_n), o));
  const EngineProbe bf16_large = keep("bf16 large", probe_engine(sh, tables(false, large_n, 2 * large_n), o));
  CpuFit bf16_fit = fit_cpu(bf16_small, bf16_large), int8s_fit{};
  if (engine_int8s) {
    const EngineProbe small = keep("int8s small", probe_engine(sh, tables(true, small_n, 2 * small_n), o));
    int8s_fit = fit_cpu(small, keep("int8s large", probe_engine(sh, tables(true, large_n, 2 * large_n), o)));
  }
  // The round trip between layers, measured where the CPU is the slower
  // path (a quarter as many streamed pages as CPU pages): there the idle
  // between two layers' CPU tasks is the round trip alone. In the probes
  // above the link outlasts the CPU, so their idle is mostly the CPU waiting
  // for the link -- taken as the latency, it priced every CPU share ~1.5 ms a
  // layer too high (an H100 host at 32K: predicted 40.8 ms for 20.7 measured).
  const EngineProbe bf16_cpu_bound =
      keep("bf16 cpu-bound", probe_engine(sh, tables(false, large_n, std::max<size_t>(1, large_n / 4)), o));
  // A probe that timed nothing (no busy time) cannot price the CPU: the one-call rate, no fixed cost.
  if (!(bf16_fit.gbps > 0 && std::isfinite(bf16_fit.gbps))) bf16_fit = {c.cpu_bf16_alone_gbps, 0.0};
  if (!(int8s_fit.gbps > 0 && std::isfinite(int8s_fit.gbps))) int8s_fit = {c.cpu_int8s_alone_gbps, 0.0};
  c.together.cpu_bf16_gbps = bf16_fit.gbps;
  c.together.cpu_int8s_gbps = int8s_fit.gbps;
  // The round trip is the layer latency; each format's intercept its task
  // cost (mixed by bytes in the planner and the feedback alike).
  c.together.cpu_layer_latency_ms = bf16_cpu_bound.idle_ms;
  c.together.cpu_bf16_task_ms = bf16_fit.fixed_ms;
  c.together.cpu_int8s_task_ms = engine_int8s ? int8s_fit.fixed_ms : bf16_fit.fixed_ms;
  c.together.link_gbps = link_with_cpu(bf16_large, c.link_alone_gbps);
  {  // the same pages resident on the GPU (HBM time: the planner's price of a resident page)
    std::vector<PageRef> bf16_table, int8s_table;
    for (size_t p = 0; p < n_pages; ++p) {
      bf16_table.push_back(PageRef{reinterpret_cast<const std::byte*>(page_of(p).data()), nullptr, sh.page_bytes(),
                                   PageKind::bf16});
      int8s_table.push_back(PageRef{blobs[p].bytes.data(), nullptr, blobs[p].bytes.size(), PageKind::int8s});
    }
    c.together.resident_bf16_gbps = resident_rate(sh, bf16_table, seconds);
    if (engine_int8s) c.together.resident_int8s_gbps = resident_rate(sh, int8s_table, seconds);
  }
  return c;
}

CoAttentionCalibration co_attention_rates_once(const AttnShape& sh, int cpu_threads, double seconds) {
  int device = 0;
  AKV_CUDA(cudaGetDevice(&device));
  using Key = std::tuple<int, int, int, int, int, int, int, int, float, int, double>;
  const Key key{device,        sh.n_kv_heads, sh.group,          sh.head_dim,  sh.page_size, sh.split_tokens,
                sh.kv_head0,   sh.page_kv_heads, sh.softmax_scale, cpu_threads, seconds};
  static std::mutex mutex;
  static std::map<Key, CoAttentionCalibration> done;
  const std::lock_guard<std::mutex> lock(mutex);  // held while measuring: one measurement at a time
  if (const auto it = done.find(key); it != done.end()) return it->second;
  return done.emplace(key, measure_co_attention_rates(sh, cpu_threads, seconds)).first->second;
}

}  // namespace activekv::cuda
