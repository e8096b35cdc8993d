// Measurement of the co-attention rates: see
// include/activekv/cuda/co_attention_rates.h.
#include "activekv/cuda/co_attention_rates.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "activekv/cpu/decode_attention.h"
#include "activekv/kv/codec_int8s.h"
#include "activekv/kv/page_store.h"
#include "cuda_check.h"
#include "device_buffer.h"

namespace activekv::cuda {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kCopyBytes = size_t(64) << 20;
constexpr int kPages = 8;

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

// The link: 64 MiB copies back to back until `stop` (or `seconds`). GB/s.
double copy_loop(const void* host, void* dev, cudaStream_t s, double seconds, const std::atomic<bool>* stop) {
  size_t bytes = 0;
  const auto t0 = Clock::now();
  do {
    for (int i = 0; i < 4; ++i) AKV_CUDA(cudaMemcpyAsync(dev, host, kCopyBytes, cudaMemcpyHostToDevice, s));
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

}  // namespace

std::string CoAttentionCalibration::describe() const {
  return fmt::format("link {:.1f} GB/s alone, {:.1f} with the CPU busy; CPU bf16 {:.1f} / {:.1f}, int8s {:.1f} / {:.1f} "
                     "GB/s alone / with the link busy ({} threads)",
                     link_alone_gbps, together.link_gbps, cpu_bf16_alone_gbps, together.cpu_bf16_gbps,
                     cpu_int8s_alone_gbps, together.cpu_int8s_gbps, together.cpu_threads);
}

CoAttentionCalibration measure_co_attention_rates(const AttnShape& sh, int cpu_threads, double seconds) {
  sh.validate();
  if (cpu_threads <= 0) throw InvalidArgument("co-attention calibration: cpu_threads must be positive");
  const kv::KvShape ks{1, sh.n_kv_heads, sh.head_dim, sh.page_size, kv::PageFormat::bf16};
  const cpu::DecodeShape ds{sh.n_kv_heads, sh.group, sh.head_dim, sh.page_size, sh.softmax_scale};
  cpu::CpuAttentionOptions o;
  o.threads = cpu_threads;
  o.split_tokens = sh.split_tokens;

  Pinned history(kPages * sh.page_bytes());
  bf16* h = static_cast<bf16*>(history.p);
  fill_history(h, kPages * ks.page_elements());
  std::vector<kv::EncodedPage> blobs;
  std::vector<kv::Int8sPageView> views;
  std::vector<cpu::PageRef> bf16_pages, int8s_pages;
  blobs.reserve(kPages);
  for (int p = 0; p < kPages; ++p) {
    const std::span<const bf16> page(h + size_t(p) * ks.page_elements(), ks.page_elements());
    bf16_pages.push_back(cpu::PageRef::from_bf16(page.data(), sh.page_size));
    blobs.push_back(kv::encode_int8s_page(ks, page, sh.page_size));
  }
  for (const kv::EncodedPage& b : blobs) views.push_back(kv::parse_int8s_page(b));
  for (const kv::Int8sPageView& v : views) int8s_pages.push_back(cpu::PageRef::from_int8s(v, sh.page_size));

  Pinned src(kCopyBytes);
  std::memset(src.p, 1, kCopyBytes);
  DevBuf dst(kCopyBytes, "co-attention calibration: copy target");
  cudaStream_t s = nullptr;
  AKV_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const std::unique_ptr<CUstream_st, void (*)(cudaStream_t)> stream(s, [](cudaStream_t x) { cudaStreamDestroy(x); });

  CoAttentionCalibration c;
  c.together.cpu_threads = cpu_threads;
  copy_loop(src.p, dst.p, s, 0.02, nullptr);  // warm-up
  c.link_alone_gbps = copy_loop(src.p, dst.p, s, seconds, nullptr);
  c.cpu_bf16_alone_gbps = cpu_loop(ds, bf16_pages, o, seconds);
  c.cpu_int8s_alone_gbps = cpu_loop(ds, int8s_pages, o, seconds);
  const auto [link_a, cpu_b] = together(ds, bf16_pages, o, seconds, src.p, dst.p, s);
  const auto [link_b, cpu_i] = together(ds, int8s_pages, o, seconds, src.p, dst.p, s);
  c.together.link_gbps = 0.5 * (link_a + link_b);
  c.together.cpu_bf16_gbps = cpu_b;
  c.together.cpu_int8s_gbps = cpu_i;
  return c;
}

}  // namespace activekv::cuda
