// Measurement of the co-attention rates: see
// include/activekv/cuda/co_attention_rates.h.
#include "activekv/cuda/co_attention_rates.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <cstring>
#include <thread>
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
constexpr size_t kHistoryBytes = size_t(256) << 20;  // past any last-level cache

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

// The link: 64 MiB copies back to back, from 8 sources in turn, until `stop`
// (or `seconds`). GB/s.
double copy_loop(const void* host, void* dev, cudaStream_t s, double seconds, const std::atomic<bool>* stop) {
  size_t bytes = 0;
  int next = 0;
  const auto t0 = Clock::now();
  do {
    for (int i = 0; i < 4; ++i, next = (next + 1) % kCopySources)
      AKV_CUDA(cudaMemcpyAsync(dev, static_cast<const std::byte*>(host) + size_t(next) * kCopyBytes, kCopyBytes,
                               cudaMemcpyHostToDevice, s));
    AKV_CUDA(cudaStreamSynchronize(s));
    bytes += 4 * kCopyBytes;
  } while (stop ? !stop->load() : seconds_since(t0) < seconds);
  return double(bytes) / seconds_since(t0) / 1e9;
}

// The CPU kernel over `pages`, call after call, for `seconds`. GB/s of history.
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

// Runs the CPU loop while a second thread copies; returns {link, cpu} GB/s.
std::pair<double, double> together(const cpu::DecodeShape& ds, const std::vector<cpu::PageRef>& pages,
                                   const cpu::CpuAttentionOptions& o, double seconds, const void* host, void* dev,
                                   cudaStream_t s) {
  std::atomic<bool> stop{false};
  double link = 0;
  std::exception_ptr err;
  std::thread copier([&] {
    try {
      link = copy_loop(host, dev, s, seconds, &stop);
    } catch (...) {
      err = std::current_exception();
    }
  });
  double cpu_rate = 0;
  try {
    cpu_rate = cpu_loop(ds, pages, o, seconds);
  } catch (...) {
    stop = true;
    copier.join();
    throw;
  }
  stop = true;
  copier.join();
  if (err) std::rethrow_exception(err);
  return {link, cpu_rate};
}

// What a layer's CPU share costs beyond its bytes, as a decode step pays it:
// between one layer's CPU attention and the next's, the partials go up, the
// GPU waits for them and merges, the next layer's q comes down, and the host
// function and its thread team start. Measured with the engine itself: 8
// layers of two pages -- one the CPU's, one streamed -- for 20 steps after 3
// warm-up ones; the idle time between a step's layers (DecodeEngine::
// CpuTiming) per layer transition, in ms. (A probe of the host function and
// the copies alone, in one stream, measured 0.08 ms on the H200 while 128K
// steps idled ~0.5-0.7 ms per transition: the planner predicted 10-30 % low.)
double layer_round_trip_ms(const AttnShape& sh, const std::byte* page0, const std::byte* page1,
                           const cpu::CpuAttentionOptions& o) {
  constexpr int kLayers = 8, kWarmup = 3, kSteps = 20;
  EngineConfig ec;
  ec.n_layers = kLayers;
  ec.attn = sh;
  ec.cpu_kernels = o;
  DecodeEngine engine(ec);
  SeqPages seq;
  seq.n_tokens = 2 * int64_t(sh.page_size);
  PageRef cpu_page{page0, nullptr, sh.page_bytes(), PageKind::bf16};
  cpu_page.cpu = true;
  const PageRef streamed{page1, nullptr, sh.page_bytes(), PageKind::bf16};
  seq.tables.assign(kLayers, std::vector<PageRef>{cpu_page, streamed});
  engine.update({seq});
  const size_t q_floats = size_t(kLayers) * size_t(sh.n_q_heads()) * size_t(sh.head_dim);  // [layer][head][dim]
  DevBuf q(q_floats * sizeof(float), "co-attention calibration: round-trip q");
  DevBuf out(q_floats * sizeof(float), "co-attention calibration: round-trip out");
  AKV_CUDA(cudaMemset(q.p, 0, q_floats * sizeof(float)));
  for (int i = 0; i < kWarmup + kSteps; ++i) {
    if (i == kWarmup) engine.reset_cpu_timing();
    engine.enqueue_step(static_cast<const float*>(q.p), static_cast<float*>(out.p), nullptr);
    engine.synchronize();  // steps apart, as a decode loop runs them: only the idle inside a step counts
  }
  const DecodeEngine::CpuTiming t = engine.cpu_timing();
  const size_t transitions = t.layers - t.steps;
  return transitions > 0 ? t.idle_ms / double(transitions) : 0.0;
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
                     "GB/s alone / with the link busy ({} threads, {:.0f} MiB of history); CPU layer latency {:.3f} ms; "
                     "GPU resident bf16 {:.0f}, int8s {:.0f} GB/s",
                     link_alone_gbps, together.link_gbps, cpu_bf16_alone_gbps, together.cpu_bf16_gbps,
                     cpu_int8s_alone_gbps, together.cpu_int8s_gbps, together.cpu_threads,
                     double(history_bytes) / double(1 << 20), together.cpu_layer_latency_ms,
                     together.resident_bf16_gbps, together.resident_int8s_gbps);
}

CoAttentionCalibration measure_co_attention_rates(const AttnShape& sh, int cpu_threads, double seconds) {
  sh.validate();
  if (cpu_threads <= 0) throw InvalidArgument("co-attention calibration: cpu_threads must be positive");
  const kv::KvShape ks{1, sh.n_kv_heads, sh.head_dim, sh.page_size, kv::PageFormat::bf16};
  const cpu::DecodeShape ds{sh.n_kv_heads, sh.group, sh.head_dim, sh.page_size, sh.softmax_scale};
  cpu::CpuAttentionOptions o;
  o.threads = cpu_threads;
  o.split_tokens = sh.split_tokens;

  const size_t n_pages = std::max<size_t>(8, (kHistoryBytes + sh.page_bytes() - 1) / sh.page_bytes());
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
  c.together.cpu_layer_latency_ms =
      layer_round_trip_ms(sh, reinterpret_cast<const std::byte*>(page_of(0).data()),
                          reinterpret_cast<const std::byte*>(page_of(1).data()), o);
  copy_loop(src.p, dst.p, s, 0.02, nullptr);  // warm-up
  c.link_alone_gbps = copy_loop(src.p, dst.p, s, seconds, nullptr);
  c.cpu_bf16_alone_gbps = cpu_loop(ds, bf16_pages, o, seconds);
  c.cpu_int8s_alone_gbps = cpu_loop(ds, int8s_pages, o, seconds);
  const auto [link_a, cpu_b] = together(ds, bf16_pages, o, seconds, src.p, dst.p, s);
  const auto [link_b, cpu_i] = together(ds, int8s_pages, o, seconds, src.p, dst.p, s);
  c.together.link_gbps = 0.5 * (link_a + link_b);
  c.together.cpu_bf16_gbps = cpu_b;
  c.together.cpu_int8s_gbps = cpu_i;
  {  // the same pages resident on the GPU (HBM time: the planner's price of a resident page)
    std::vector<PageRef> bf16_table, int8s_table;
    for (size_t p = 0; p < n_pages; ++p) {
      bf16_table.push_back(PageRef{reinterpret_cast<const std::byte*>(page_of(p).data()), nullptr, sh.page_bytes(),
                                   PageKind::bf16});
      int8s_table.push_back(PageRef{blobs[p].bytes.data(), nullptr, blobs[p].bytes.size(), PageKind::int8s});
    }
    c.together.resident_bf16_gbps = resident_rate(sh, bf16_table, seconds);
    c.together.resident_int8s_gbps = resident_rate(sh, int8s_table, seconds);
  }
  return c;
}

}  // namespace activekv::cuda
