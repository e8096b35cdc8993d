// `calibrate`: H2D bandwidth vs copy size and kernel times vs context, the
// transfer model's profile (SPEC §6). See gpu_bench.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "activekv/cuda/format_kernels.h"
#include "activekv/cuda/pinned_memory.h"
#include "activekv/kv/codec.h"
#include "bandwidth.h"
#include "bench_util.h"
#include "gpu_bench.h"

namespace activekv::gpu_bench {

using cuda::Partials;
using cuda::SplitWork;
using cuda::UnpackWork;

namespace {

// int8s kernel curve (same token counts as the bf16 one) and the lossless13
// unpack time per page, on pages encoded from the random bf16 data by the CPU
// codecs. `dev_scratch` holds at least kernel_tokens.back() / page_size bf16 pages.
template <class TimeFn>
void calibrate_formats(Profile& pr, const std::byte* host_bf16, std::byte* dev_scratch, const float* q, Partials parts,
                       SplitWork* work_dev, TimeFn& time_ms, int reps, const Int8sKernelOptions& kopt,
                       cudaStream_t st) {
  const AttnShape& sh = pr.attn;
  const kv::KvShape ks{1, sh.page_heads(), sh.head_dim, sh.page_size};  // whole pages (a head shard reads its heads)
  const int64_t n_pages = int64_t(pr.kernel_tokens.back()) / sh.page_size;
  const size_t ib = (kv::encoded_page_bytes(kv::CodecFormat::int8s, ks) + 255) / 256 * 256;
  std::vector<kv::EncodedPage> enc(static_cast<size_t>(n_pages));
  auto encode = [&](kv::CodecFormat f, int64_t count) {
    parallel_for(size_t(count), host_threads(), [&](size_t p) {
      const auto* page = reinterpret_cast<const activekv::bf16*>(host_bf16 + p * sh.page_bytes());
      enc[p] = kv::encode_page(f, ks, {page, ks.page_elements()}, sh.page_size);
    });
  };
  // int8s pages packed at 256-byte strides into the (larger) bf16 scratch.
  encode(kv::CodecFormat::int8s, n_pages);
  for (int64_t p = 0; p < n_pages; ++p)
    AKV_CUDA(cudaMemcpy(dev_scratch + size_t(p) * ib, enc[size_t(p)].bytes.data(), enc[size_t(p)].bytes.size(),
                        cudaMemcpyHostToDevice));
  std::printf("  int8s attention kernel (%s, resident, batch 1, one layer)\n  %10s %12s %10s\n", cuda::int8s_kernel_name(cuda::resolve_int8s_kernel(kopt.kernel, sh)),
              "tokens", "kernel ms", "GB/s");
  for (double nt : pr.kernel_tokens) {
    const int64_t n = int64_t(nt);
    std::vector<SplitWork> w;
    for (int64_t t = 0; t < n; t += sh.split_tokens)
      w.push_back(SplitWork{dev_scratch + size_t(t / sh.page_size) * ib, 0, int32_t(t % sh.page_size),
                            int32_t(std::min<int64_t>(sh.split_tokens, n - t)), int32_t(t / sh.split_tokens)});
    AKV_CUDA(cudaMemcpy(work_dev, w.data(), w.size() * sizeof(SplitWork), cudaMemcpyHostToDevice));
    const double kms = time_ms([&] {
      cuda::launch_split_attention_int8s(sh, work_dev, int(w.size()), q, parts, kopt, st);
    }, reps);
    pr.int8s_kernel_ms.push_back(kms);
    std::printf("  %10lld %12.4f %10.1f\n", static_cast<long long>(n), kms, double(n) / sh.page_size * ib / (kms * 1e6));
  }
  // lossless13: unpack 32 pages (blobs first, bf16 pages after them).
  // Blobs (< 1 bf16 page each) in the first half of the scratch, bf16 output in the second.
  const int64_t n13 = std::min<int64_t>(32, n_pages / 2);
  encode(kv::CodecFormat::lossless13, n13);
  size_t off = 0;
  std::vector<UnpackWork> items;
  std::byte* dst0 = dev_scratch + size_t(n_pages / 2) * sh.page_bytes();
  for (int64_t p = 0; p < n13; ++p) {
    AKV_CUDA(cudaMemcpy(dev_scratch + off, enc[size_t(p)].bytes.data(), enc[size_t(p)].bytes.size(),
                        cudaMemcpyHostToDevice));
    items.push_back(UnpackWork{dev_scratch + off, dst0 + size_t(p) * sh.page_bytes(), enc[size_t(p)].bytes.size()});
    off += (enc[size_t(p)].bytes.size() + 255) / 256 * 256;
  }
  DevBuf items_dev(items.size() * sizeof(UnpackWork), "calibrate: unpack list");
  AKV_CUDA(cudaMemcpy(items_dev.p, items.data(), items.size() * sizeof(UnpackWork), cudaMemcpyHostToDevice));
  const double ums = time_ms([&] { cuda::launch_unpack_lossless13(sh, items_dev.as<UnpackWork>(), int(n13), st); }, reps);
  pr.unpack_ms_per_page = ums / double(n13);
  std::printf("  lossless13 unpack: %.4f ms per page (%lld pages, %.1f GB/s of bf16 written)\n", pr.unpack_ms_per_page,
              static_cast<long long>(n13), double(n13) * sh.page_bytes() / (ums * 1e6));
}

// The stream and events calibrate times on, released however it ends.
struct Timing {
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  Timing() {
    AKV_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    AKV_CUDA(cudaEventCreate(&start));
    AKV_CUDA(cudaEventCreate(&stop));
  }
  ~Timing() {
    if (stream) cudaStreamSynchronize(stream);
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    if (stream) cudaStreamDestroy(stream);
  }
  Timing(const Timing&) = delete;
  Timing& operator=(const Timing&) = delete;
};

// Pinned host bytes (the memory the page store streams from), freed on scope exit.
struct PinnedBuffer {
  std::byte* p;
  size_t bytes;
  explicit PinnedBuffer(size_t n) : p(cuda::pinned_host_memory().allocate(n)), bytes(n) {}
  ~PinnedBuffer() { cuda::pinned_host_memory().free(p, bytes); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
};

// Byte and token counts are whole numbers: JSON gets them as integers.
std::vector<int64_t> as_integers(const std::vector<double>& v) { return {v.begin(), v.end()}; }

}  // namespace

double Profile::bandwidth_gbps(double bytes) const { return interp(copy_bytes, copy_gbps, bytes, true, false); }
double Profile::kernel_time_ms(double tokens) const {
  return std::max(0.0, interp(kernel_tokens, kernel_ms, tokens, false, true));
}
double Profile::int8s_kernel_time_ms(double tokens) const {
  return std::max(0.0, interp(kernel_tokens, int8s_kernel_ms, tokens, false, true));
}
double Profile::merge_time_ms(double splits) const {
  return std::max(0.0, interp(merge_splits, merge_ms, splits, false, true));
}

nlohmann::json Profile::to_json() const {
  return {
      {"device", device},
      {"shape", {{"n_kv_heads", attn.n_kv_heads}, {"group", attn.group}, {"head_dim", attn.head_dim},
                 {"page_size", attn.page_size}, {"split_tokens", attn.split_tokens}}},
      {"h2d_latency_ms", latency_ms},
      {"h2d_copy_bytes", as_integers(copy_bytes)},
      {"h2d_gbps", copy_gbps},
      {"kernel_tokens", as_integers(kernel_tokens)},
      {"kernel_ms", kernel_ms},
      {"merge_splits", as_integers(merge_splits)},
      {"merge_ms", merge_ms},
      {"int8s_kernel_ms", int8s_kernel_ms},
      {"lossless13_unpack_ms_per_page", unpack_ms_per_page},
      {"model", "t_copy(b) = b / B(b) (B: back-to-back pinned H2D bandwidth at copy size b, log-size interpolation); "
                "step = job-by-job simulation of the copy stream and the compute stream with ring-slot waits"},
  };
}

Profile calibrate(const CalibrateOptions& opt) {
  opt.attn.validate();
  cuda::require_gpu(opt.device, "calibrate");
  std::ofstream file = open_output(opt.out_path, "calibrate");
  Profile pr;
  pr.device = device_name(opt.device);
  pr.attn = opt.attn;
  Timing timing;
  cudaStream_t st = timing.stream;
  cudaEvent_t e0 = timing.start, e1 = timing.stop;
  auto time_ms = [&](auto&& body, int reps) {
    std::vector<double> t;
    body();  // warm-up
    AKV_CUDA(cudaStreamSynchronize(st));
    for (int r = 0; r < reps; ++r) {
      AKV_CUDA(cudaEventRecord(e0, st));
      body();
      AKV_CUDA(cudaEventRecord(e1, st));
      AKV_CUDA(cudaEventSynchronize(e1));
      float ms = 0;
      AKV_CUDA(cudaEventElapsedTime(&ms, e0, e1));
      t.push_back(ms);
    }
    return median(t);
  };

  // --- H2D bandwidth vs copy size -----------------------------------------
  const size_t kMax = size_t(512) << 20;
  const PinnedBuffer host(kMax);
  fill_random_bf16(host.p, kMax, 1, host_threads());
  DevBuf dst(kMax, "calibrate: copy target");
  pr.latency_ms = time_ms([&] { AKV_CUDA(cudaMemcpyAsync(dst.p, host.p, 4096, cudaMemcpyHostToDevice, st)); },
                          opt.reps * 5);
  std::printf("calibrate: %s\n  H2D pinned, back-to-back copies (latency of one 4 KiB copy: %.4f ms)\n",
              pr.device.c_str(), pr.latency_ms);
  std::printf("  %12s %10s\n", "copy bytes", "GB/s");
  for (size_t sz = size_t(64) << 10; sz <= kMax; sz *= 2) {
    const int n = int(std::max<size_t>(1, std::min<size_t>(64, kMax / sz)));
    const double ms = time_ms([&] { enqueue_h2d_copies(dst.as<std::byte>(), host.p, sz, n, kMax, st); },
                              std::max(3, opt.reps / 4));
    pr.copy_bytes.push_back(double(sz));
    pr.copy_gbps.push_back(double(sz) * n / (ms * 1e6));
    std::printf("  %12zu %10.2f\n", sz, pr.copy_gbps.back());
  }

  // --- kernel time vs context (resident, batch 1, one layer) ----------------
  const AttnShape& sh = opt.attn;
  const int64_t kMaxTokens = 131072;
  const int64_t n_pages = kMaxTokens / sh.page_size;
  DevBuf pages(size_t(n_pages) * sh.page_bytes(), "calibrate: resident pages");
  for (int64_t p = 0; p < n_pages; ++p)  // fill from the random pinned buffer (cycled)
    AKV_CUDA(cudaMemcpy(pages.as<std::byte>() + size_t(p) * sh.page_bytes(),
                        host.p + (size_t(p) * sh.page_bytes()) % (kMax - sh.page_bytes() + 1),
                        sh.page_bytes(), cudaMemcpyHostToDevice));
  DevBuf q(size_t(sh.n_q_heads()) * sh.head_dim * sizeof(float), "calibrate: query");
  fill_device_random(q.as<float>(), size_t(sh.n_q_heads()) * sh.head_dim, 3);
  const int max_splits = int(kMaxTokens / sh.split_tokens);
  DevBuf po(size_t(max_splits) * sh.n_q_heads() * sh.head_dim * sizeof(float), "calibrate: partial outputs");
  DevBuf pl(size_t(max_splits) * sh.n_q_heads() * sizeof(float), "calibrate: partial LSE");
  DevBuf out(size_t(sh.n_q_heads()) * sh.head_dim * sizeof(float), "calibrate: output");
  DevBuf nsp(sizeof(int32_t), "calibrate: split count");
  DevBuf work(size_t(max_splits) * sizeof(SplitWork), "calibrate: work list");
  Partials parts{po.as<float>(), pl.as<float>(), max_splits};
  std::printf("  attention kernel (resident, batch 1, one layer)\n  %10s %12s %12s %10s\n", "tokens", "kernel ms",
              "merge ms", "GB/s");
  for (int64_t n : {int64_t(4096), int64_t(16384), int64_t(32768), int64_t(65536), int64_t(131072)}) {
    std::vector<SplitWork> w;
    for (int64_t t = 0; t < n; t += sh.split_tokens) {
      SplitWork s;
      s.page = pages.as<std::byte>() + size_t(t / sh.page_size) * sh.page_bytes();
      s.seq = 0;
      s.tok0 = int32_t(t % sh.page_size);
      s.ntok = int32_t(std::min<int64_t>(sh.split_tokens, n - t));
      s.split = int32_t(t / sh.split_tokens);
      w.push_back(s);
    }
    AKV_CUDA(cudaMemcpy(work.p, w.data(), w.size() * sizeof(SplitWork), cudaMemcpyHostToDevice));
    const int32_t ns = int32_t(w.size());
    AKV_CUDA(cudaMemcpy(nsp.p, &ns, sizeof ns, cudaMemcpyHostToDevice));
    const double kms = time_ms([&] {
      cuda::launch_split_attention(sh, work.as<SplitWork>(), int(w.size()), q.as<float>(), parts, st);
    }, opt.reps);
    const double mms = time_ms([&] {
      cuda::launch_merge(sh, parts, nsp.as<int32_t>(), 1, out.as<float>(), nullptr, st);
    }, opt.reps);
    pr.kernel_tokens.push_back(double(n));
    pr.kernel_ms.push_back(kms);
    pr.merge_splits.push_back(double(w.size()));
    pr.merge_ms.push_back(mms);
    std::printf("  %10lld %12.4f %12.4f %10.1f\n", static_cast<long long>(n), kms, mms,
                double(n) * 2 * sh.n_kv_heads * sh.head_dim * 2 / (kms * 1e6));
  }
  calibrate_formats(pr, host.p, pages.as<std::byte>(), q.as<float>(), parts, work.as<SplitWork>(), time_ms,
                    opt.reps, opt.int8s, st);
  if (file.is_open()) {
    nlohmann::json j = {{"commit", opt.provenance.commit}, {"command", opt.provenance.command},
                        {"environment", opt.provenance.environment}};
    j.update(pr.to_json());
    file << j.dump(2) << "\n";
    if (!file.flush()) throw Error("calibrate: writing " + opt.out_path + " failed");
    std::printf("  profile written to %s\n", opt.out_path.c_str());
  }
  return pr;
}

}  // namespace activekv::gpu_bench
