// calibrate + bench decode. See include/activekv/cuda/bench.h.
#include "activekv/cuda/bench.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include "activekv/cuda/decode_engine.h"
#include "activekv/cuda/format_kernels.h"
#include "activekv/kv/codec.h"
#include "bench_pages.h"

namespace activekv::cuda {

namespace {
#define AKV_CUDA(call) check_cuda(static_cast<int>(call), #call)

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

double interp(const std::vector<double>& x, const std::vector<double>& y, double at, bool logx, bool extrapolate) {
  if (x.empty()) return 0;
  if (x.size() == 1) return y[0];
  auto X = [&](double v) { return logx ? std::log(v) : v; };
  size_t i = 1;
  while (i + 1 < x.size() && at > x[i]) ++i;
  if (!extrapolate) {
    if (at <= x.front()) return y.front();
    if (at >= x.back()) return y.back();
  }
  const double t = (X(at) - X(x[i - 1])) / (X(x[i]) - X(x[i - 1]));
  return y[i - 1] + t * (y[i] - y[i - 1]);
}

std::string jstr(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') { o += '\\'; o += c; }
    else if (c == '\n') o += "\\n";
    else if (static_cast<unsigned char>(c) < 0x20) o += ' ';
    else o += c;
  }
  return o + "\"";
}
std::string jnum(double v) {
  if (!std::isfinite(v)) return "null";
  char b[64];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}
template <class T> std::string jarr(const std::vector<T>& v) {
  std::string o = "[";
  for (size_t i = 0; i < v.size(); ++i) o += (i ? ", " : "") + jnum(double(v[i]));
  return o + "]";
}

// Selects `dev`, or says plainly that this machine has no usable GPU (the
// runtime's own message for that case is "CUDA driver version is insufficient").
void select_device(int dev) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    cudaGetLastError();
    throw CudaError(std::string("no usable CUDA GPU on this machine (cudaGetDeviceCount: ") +
                    (e == cudaSuccess ? "0 devices" : cudaGetErrorString(e)) + ")");
  }
  if (dev < 0 || dev >= n)
    throw InvalidArgument("GPU " + std::to_string(dev) + " does not exist (" + std::to_string(n) + " found)");
  AKV_CUDA(cudaSetDevice(dev));
}

std::string device_name(int dev) {
  cudaDeviceProp p{};
  AKV_CUDA(cudaGetDeviceProperties(&p, dev));
  return p.name;
}

struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(size_t bytes) {
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw CudaError("cudaMalloc of " + std::to_string(bytes) + " bytes failed: " + cudaGetErrorString(e));
    }
  }
  ~DevBuf() { if (p) cudaFree(p); }
  template <class T> T* as() const { return static_cast<T*>(p); }
};

void fill_device_random(float* d, size_t n, uint64_t seed) {
  std::vector<float> h(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 7;
  for (auto& v : h) {
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    v = float(double(x >> 11) / double(1ull << 53) * 2.0 - 1.0);
  }
  AKV_CUDA(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
}


// int8s kernel curve (same token counts as the bf16 one) and the lossless13
// unpack time per page, on pages encoded from the random bf16 data by the CPU
// codecs. `dev_scratch` holds at least kernel_tokens.back() / page_size bf16 pages.
template <class TimeFn>
void calibrate_formats(Profile& pr, const std::byte* host_bf16, std::byte* dev_scratch, const float* q, Partials parts,
                       SplitWork* work_dev, int32_t* nsp, float* out, TimeFn& time_ms, int reps, cudaStream_t st) {
  const AttnShape& sh = pr.attn;
  const kv::KvShape ks{1, sh.n_kv_heads, sh.head_dim, sh.page_size};
  const int64_t n_pages = int64_t(pr.kernel_tokens.back()) / sh.page_size;
  const size_t ib = (kv::encoded_page_bytes(kv::CodecFormat::int8s, ks) + 255) / 256 * 256;
  const int threads = int(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<kv::EncodedPage> enc(static_cast<size_t>(n_pages));
  auto encode = [&](kv::CodecFormat f, int64_t count) {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        for (int64_t p = t; p < count; p += threads) {
          const auto* page = reinterpret_cast<const activekv::bf16*>(host_bf16 + size_t(p) * sh.page_bytes());
          enc[size_t(p)] = kv::encode_page(f, ks, {page, ks.page_elements()}, sh.page_size);
        }
      });
    for (auto& th : pool) th.join();
  };
  // int8s pages packed at 256-byte strides into the (larger) bf16 scratch.
  encode(kv::CodecFormat::int8s, n_pages);
  for (int64_t p = 0; p < n_pages; ++p)
    AKV_CUDA(cudaMemcpy(dev_scratch + size_t(p) * ib, enc[size_t(p)].bytes.data(), enc[size_t(p)].bytes.size(),
                        cudaMemcpyHostToDevice));
  std::printf("  int8s attention kernel (resident, batch 1, one layer)\\n  %10s %12s %10s\\n", "tokens", "kernel ms",
              "GB/s");
  for (double nt : pr.kernel_tokens) {
    const int64_t n = int64_t(nt);
    std::vector<SplitWork> w;
    for (int64_t t = 0; t < n; t += sh.split_tokens)
      w.push_back(SplitWork{dev_scratch + size_t(t / sh.page_size) * ib, 0, int32_t(t % sh.page_size),
                            int32_t(std::min<int64_t>(sh.split_tokens, n - t)), int32_t(t / sh.split_tokens)});
    AKV_CUDA(cudaMemcpy(work_dev, w.data(), w.size() * sizeof(SplitWork), cudaMemcpyHostToDevice));
    const double kms = time_ms([&] {
      launch_split_attention_int8s(sh, work_dev, int(w.size()), q, parts, Int8sKernelOptions{}, st);
    }, reps);
    pr.int8s_kernel_ms.push_back(kms);
    std::printf("  %10lld %12.4f %10.1f\\n", static_cast<long long>(n), kms, double(n) / sh.page_size * ib / (kms * 1e6));
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
  DevBuf items_dev(items.size() * sizeof(UnpackWork));
  AKV_CUDA(cudaMemcpy(items_dev.p, items.data(), items.size() * sizeof(UnpackWork), cudaMemcpyHostToDevice));
  const double ums = time_ms([&] { launch_unpack_lossless13(sh, items_dev.as<UnpackWork>(), int(n13), st); }, reps);
  pr.unpack_ms_per_page = ums / double(n13);
  std::printf("  lossless13 unpack: %.4f ms per page (%lld pages, %.1f GB/s of bf16 written)\\n", pr.unpack_ms_per_page,
              static_cast<long long>(n13), double(n13) * sh.page_bytes() / (ums * 1e6));
  (void)nsp;
  (void)out;
}

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

std::string Profile::to_json() const {
  std::ostringstream o;
  o << "{\n  \"device\": " << jstr(device) << ",\n"
    << "  \"shape\": {\"n_kv_heads\": " << attn.n_kv_heads << ", \"group\": " << attn.group
    << ", \"head_dim\": " << attn.head_dim << ", \"page_size\": " << attn.page_size
    << ", \"split_tokens\": " << attn.split_tokens << "},\n"
    << "  \"h2d_latency_ms\": " << jnum(latency_ms) << ",\n"
    << "  \"h2d_copy_bytes\": " << jarr(copy_bytes) << ",\n"
    << "  \"h2d_gbps\": " << jarr(copy_gbps) << ",\n"
    << "  \"kernel_tokens\": " << jarr(kernel_tokens) << ",\n"
    << "  \"kernel_ms\": " << jarr(kernel_ms) << ",\n"
    << "  \"merge_splits\": " << jarr(merge_splits) << ",\n"
    << "  \"merge_ms\": " << jarr(merge_ms) << ",\n"
    << "  \"int8s_kernel_ms\": " << jarr(int8s_kernel_ms) << ",\n"
    << "  \"lossless13_unpack_ms_per_page\": " << jnum(unpack_ms_per_page) << ",\n"
    << "  \"model\": \"t_copy(b) = b / B(b) (B: back-to-back pinned H2D bandwidth at copy size b, log-size interpolation); "
       "step = job-by-job simulation of the copy stream and the compute stream with ring-slot waits\"\n}\n";
  return o.str();
}

Profile calibrate(const CalibrateOptions& opt) {
  select_device(opt.device);
  opt.attn.validate();
  Profile pr;
  pr.device = device_name(opt.device);
  pr.attn = opt.attn;
  cudaStream_t st;
  AKV_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  AKV_CUDA(cudaEventCreate(&e0));
  AKV_CUDA(cudaEventCreate(&e1));
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
  PinnedPagePool host(kMax, 1);
  fill_random_bf16(host.data(), kMax, 1, int(std::max(1u, std::thread::hardware_concurrency())));
  DevBuf dst(kMax);
  pr.latency_ms = time_ms([&] { AKV_CUDA(cudaMemcpyAsync(dst.p, host.data(), 4096, cudaMemcpyHostToDevice, st)); },
                          opt.reps * 5);
  std::printf("calibrate: %s\n  H2D pinned, back-to-back copies (latency of one 4 KiB copy: %.4f ms)\n",
              pr.device.c_str(), pr.latency_ms);
  std::printf("  %12s %10s\n", "copy bytes", "GB/s");
  for (size_t sz = size_t(64) << 10; sz <= kMax; sz *= 2) {
    const int n = int(std::max<size_t>(1, std::min<size_t>(64, kMax / sz)));
    const double ms = time_ms([&] {
      for (int i = 0; i < n; ++i)
        AKV_CUDA(cudaMemcpyAsync(dst.as<std::byte>() + size_t(i) * sz % kMax, host.data() + size_t(i) * sz % kMax, sz,
                                 cudaMemcpyHostToDevice, st));
    }, std::max(3, opt.reps / 4));
    pr.copy_bytes.push_back(double(sz));
    pr.copy_gbps.push_back(double(sz) * n / (ms * 1e6));
    std::printf("  %12zu %10.2f\n", sz, pr.copy_gbps.back());
  }

  // --- kernel time vs context (resident, batch 1, one layer) ----------------
  const AttnShape& sh = opt.attn;
  const int64_t kMaxTokens = 131072;
  const int64_t n_pages = kMaxTokens / sh.page_size;
  DevBuf pages(size_t(n_pages) * sh.page_bytes());
  for (int64_t p = 0; p < n_pages; ++p)  // fill from the random pinned buffer (cycled)
    AKV_CUDA(cudaMemcpy(pages.as<std::byte>() + size_t(p) * sh.page_bytes(),
                        host.data() + (size_t(p) * sh.page_bytes()) % (kMax - sh.page_bytes() + 1),
                        sh.page_bytes(), cudaMemcpyHostToDevice));
  DevBuf q(size_t(sh.n_q_heads()) * sh.head_dim * sizeof(float));
  fill_device_random(q.as<float>(), size_t(sh.n_q_heads()) * sh.head_dim, 3);
  const int max_splits = int(kMaxTokens / sh.split_tokens);
  DevBuf po(size_t(max_splits) * sh.n_q_heads() * sh.head_dim * sizeof(float));
  DevBuf pl(size_t(max_splits) * sh.n_q_heads() * sizeof(float));
  DevBuf out(size_t(sh.n_q_heads()) * sh.head_dim * sizeof(float));
  DevBuf nsp(sizeof(int32_t));
  DevBuf work(size_t(max_splits) * sizeof(SplitWork));
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
      launch_split_attention(sh, work.as<SplitWork>(), int(w.size()), q.as<float>(), parts, st);
    }, opt.reps);
    const double mms = time_ms([&] {
      launch_merge(sh, parts, nsp.as<int32_t>(), 1, out.as<float>(), nullptr, st);
    }, opt.reps);
    pr.kernel_tokens.push_back(double(n));
    pr.kernel_ms.push_back(kms);
    pr.merge_splits.push_back(double(w.size()));
    pr.merge_ms.push_back(mms);
    std::printf("  %10lld %12.4f %12.4f %10.1f\n", static_cast<long long>(n), kms, mms,
                double(n) * 2 * sh.n_kv_heads * sh.head_dim * 2 / (kms * 1e6));
  }
  calibrate_formats(pr, host.data(), pages.as<std::byte>(), q.as<float>(), parts, work.as<SplitWork>(),
                    nsp.as<int32_t>(), out.as<float>(), time_ms, opt.reps, st);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(st);
  if (!opt.out_path.empty()) {
    std::ofstream f(opt.out_path);
    if (!f) throw Error("calibrate: cannot write " + opt.out_path);
    f << pr.to_json();
    std::printf("  profile written to %s\n", opt.out_path.c_str());
  }
  return pr;
}

std::vector<int64_t> parse_sizes(const std::string& list) {
  std::vector<int64_t> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    int64_t mult = 1;
    char last = item.back();
    if (last == 'k' || last == 'K') { mult = 1024; item.pop_back(); }
    try {
      size_t pos = 0;
      const long long v = std::stoll(item, &pos);
      if (pos != item.size() || v <= 0) throw std::invalid_argument("");
      out.push_back(v * mult);
    } catch (const std::exception&) {
      throw InvalidArgument("not a positive size: '" + item + "' (expected e.g. 32k,64k,131072)");
    }
  }
  if (out.empty()) throw InvalidArgument("empty size list '" + list + "'");
  return out;
}

namespace {

struct Record {
  std::string format, mode;
  int64_t context;
  int batch;
  double step_ms, step_ms_min, step_ms_max;
  double device_ms;      // compute-stream span of the step (cudaEvent), median
  double history_bytes;  // bytes the step's pages take across the bus (also for resident: what streaming would move)
  double bytes_per_step, gbps, bus_limit_ms, bus_limit_ratio, predicted_ms, chunk_gbps;
  size_t copies_per_step, largest_copy;
  int jobs_per_layer;
  bool bitwise_equal_resident;
  bool repeatable;
};

double predict_ms(const Profile& pr, const DecodeEngine& eng, int n_layers, int64_t splits_per_seq) {
  const int R = eng.config().ring_slots;
  const bool streamed = eng.config().mode == Mode::streamed;
  std::vector<double> comp_end;
  double copy_free = 0, comp_free = 0;
  for (int l = 0; l < n_layers; ++l) {
    const auto jobs = eng.job_info(l);
    for (size_t j = 0; j < jobs.size(); ++j) {
      const size_t k = comp_end.size();
      double copy_end = 0;
      if (streamed) {
        double start = copy_free;
        if (k >= size_t(R)) start = std::max(start, comp_end[k - R]);
        double t = 0;
        for (size_t b : jobs[j].copy_bytes) t += pr.copy_time_ms(double(b));
        copy_end = start + t;
        copy_free = copy_end;
      }
      double start = std::max(comp_free, copy_end);
      const auto& tk = jobs[j].tokens_by_kind;
      const double kernel = pr.kernel_time_ms(double(tk[0] + tk[2])) +
                            (tk[1] > 0 ? pr.int8s_kernel_time_ms(double(tk[1])) : 0.0) +
                            pr.unpack_ms_per_page * double((tk[2] + pr.attn.page_size - 1) / pr.attn.page_size);
      double end = start + kernel;
      if (j + 1 == jobs.size()) end += pr.merge_time_ms(double(splits_per_seq));
      comp_end.push_back(end);
      comp_free = end;
    }
  }
  return comp_free;
}

}  // namespace

namespace {

void print_table(const std::vector<Record>& records) {
  // llama-bench vocabulary: depth = context tokens, t/s = tokens generated per second.
  std::printf("\n| %-10s | %-15s | %7s | %5s | %9s | %17s | %8s | %9s | %6s | %9s | %6s |\n", "kv-format", "mode",
              "depth", "batch", "step ms", "min - max", "t/s", "bus ms", "ratio", "pred ms", "err %");
  std::printf("|%s|\n", std::string(130, '-').c_str());
  for (const auto& r : records)
    std::printf("| %-10s | %-15s | %7lld | %5d | %9.3f | %8.3f - %6.3f | %8.2f | %9.3f | %6.3f | %9.3f | %6.2f |\n",
                r.format.c_str(), r.mode.c_str(), static_cast<long long>(r.context), r.batch, r.step_ms,
                r.step_ms_min, r.step_ms_max, r.batch * 1000.0 / r.step_ms, r.bus_limit_ms, r.bus_limit_ratio,
                r.predicted_ms, 100.0 * (r.predicted_ms - r.step_ms) / r.step_ms);
}

const Record* find_record(const std::vector<Record>& rs, const std::string& f, const std::string& m, int64_t ctx,
                          int batch) {
  for (const Record& r : rs)
    if (r.format == f && r.mode == m && r.context == ctx && r.batch == batch) return &r;
  return nullptr;
}

void write_json(const BenchDecodeOptions& opt, const Profile& pr, const bench::HistorySet& hist,
                const std::vector<Record>& records) {
  const AttnShape& sh = opt.attn;
  std::ofstream f(opt.json_path);
  if (!f) throw Error("bench decode: cannot write " + opt.json_path);
  auto conv = [](const bench::HistorySet::Conversion& c) {
    return "{\"pages\": " + std::to_string(c.pages) + ", \"seconds\": " + jnum(c.seconds) +
           ", \"threads\": " + std::to_string(c.threads) + ", \"pages_per_s\": " +
           jnum(c.seconds > 0 ? double(c.pages) / c.seconds : 0.0) + "}";
  };
  f << "{\n  \"device\": " << jstr(pr.device) << ",\n  \"commit\": " << jstr(opt.commit)
    << ",\n  \"command\": " << jstr(opt.command) << ",\n  \"shape\": {\"n_layers\": " << opt.n_layers
    << ", \"n_kv_heads\": " << sh.n_kv_heads << ", \"n_q_heads\": " << sh.n_q_heads()
    << ", \"head_dim\": " << sh.head_dim << ", \"page_size\": " << sh.page_size
    << ", \"split_tokens\": " << sh.split_tokens << ", \"tile_pages\": " << opt.tile_pages
    << ", \"ring_slots\": " << opt.ring_slots << ", \"recent_pages\": " << opt.recent_pages << "},\n"
    << "  \"int8s_kernel\": {\"query_terms\": " << opt.int8s.query_terms
    << ", \"skip_unit_rescale\": " << (opt.int8s.skip_unit_rescale ? "true" : "false")
    << ", \"pow2_reference\": " << (opt.int8s.pow2_reference ? "true" : "false")
    << ", \"tensor_cores\": " << (opt.int8s.tensor_cores ? "true" : "false") << "},\n"
    << "  \"conversion_cpu\": {\"int8s\": " << conv(hist.int8s_conv) << ", \"lossless13\": "
    << conv(hist.lossless13_conv) << "},\n"
    << "  \"profile\": " << pr.to_json() << ",\n  \"records\": [\n";
  for (size_t i = 0; i < records.size(); ++i) {
    const Record& r = records[i];
    f << "    {\"format\": " << jstr(r.format) << ", \"mode\": " << jstr(r.mode) << ", \"context\": " << r.context
      << ", \"depth\": " << r.context << ", \"batch\": " << r.batch << ", \"step_ms\": " << jnum(r.step_ms)
      << ", \"step_ms_min\": " << jnum(r.step_ms_min) << ", \"step_ms_max\": " << jnum(r.step_ms_max)
      << ", \"device_ms\": " << jnum(r.device_ms)
      << ", \"steps\": " << opt.steps << ", \"t_per_s\": " << jnum(r.batch * 1000.0 / r.step_ms)
      << ", \"history_bytes\": " << jnum(r.history_bytes)
      << ", \"bytes_per_step\": " << jnum(r.bytes_per_step) << ", \"gbps\": " << jnum(r.gbps)
      << ", \"copies_per_step\": " << r.copies_per_step << ", \"largest_copy\": " << r.largest_copy
      << ", \"jobs_per_layer\": " << r.jobs_per_layer << ", \"chunk_gbps\": " << jnum(r.chunk_gbps)
      << ", \"bus_limit_ms\": " << jnum(r.bus_limit_ms) << ", \"bus_limit_ratio\": " << jnum(r.bus_limit_ratio)
      << ", \"predicted_ms\": " << jnum(r.predicted_ms)
      << ", \"prediction_error\": " << jnum((r.predicted_ms - r.step_ms) / r.step_ms)
      << ", \"bitwise_equal_resident\": " << (r.bitwise_equal_resident ? "true" : "false")
      << ", \"repeatable\": " << (r.repeatable ? "true" : "false") << "}"
      << (i + 1 < records.size() ? ",\n" : "\n");
  }
  f << "  ]\n}\n";
  std::printf("\nJSON written to %s\n", opt.json_path.c_str());
}

// Batch 2 in one launch vs two batch-1 launches (SPEC §4 batched decode), resident device time.
void print_batching(const std::vector<Record>& rs) {
  bool header = false;
  for (const Record& r2 : rs) {
    if (r2.mode != "resident" || r2.batch != 2) continue;
    const Record* r1 = find_record(rs, r2.format, "resident", r2.context, 1);
    if (!r1) continue;
    if (!header) std::printf("\nbatched decode, resident device time per step (16 layers):\n"), header = true;
    std::printf("  %-10s depth %7lld: batch 2 in one launch %.3f ms, two batch-1 launches %.3f ms (ratio %.3f)\n",
                r2.format.c_str(), static_cast<long long>(r2.context), r2.device_ms, 2 * r1->device_ms,
                r2.device_ms / (2 * r1->device_ms));
  }
}

}  // namespace

int run_bench_decode(const BenchDecodeOptions& opt) {
  select_device(opt.device);
  const AttnShape& sh = opt.attn;
  sh.validate();
  for (const auto& m : opt.modes)
    if (m != "streamed" && m != "resident" && m != "streamed-whole")
      throw InvalidArgument("bench decode: unknown mode '" + m + "' (streamed, streamed-whole, resident)");
  for (const auto& f : opt.formats)
    if (std::find(bench::route_names().begin(), bench::route_names().end(), f) == bench::route_names().end())
      throw InvalidArgument("bench decode: unknown --kv-format '" + f + "' (bf16, lossless13, int8s, hybrid)");
  if (opt.steps < 1 || opt.warmup < 0) throw InvalidArgument("bench decode: steps must be >= 1, warmup >= 0");
  const int threads = opt.host_threads > 0 ? opt.host_threads : int(std::max(1u, std::thread::hardware_concurrency()));
  auto wants = [&](const char* f) { return std::find(opt.formats.begin(), opt.formats.end(), f) != opt.formats.end(); };

  CalibrateOptions copt;
  copt.attn = sh;
  copt.out_path = opt.profile_path;
  copt.device = opt.device;
  const Profile pr = calibrate(copt);

  const int64_t max_ctx = *std::max_element(opt.contexts.begin(), opt.contexts.end());
  const int max_batch = *std::max_element(opt.batches.begin(), opt.batches.end());
  std::printf("\nbench decode: %d layers, %d KV heads x %d, %d query heads, page %d tokens (bf16 %.1f MiB), "
              "kv-formats", opt.n_layers, sh.n_kv_heads, sh.head_dim, sh.n_q_heads(), sh.page_size,
              sh.page_bytes() / 1048576.0);
  for (const auto& f : opt.formats) std::printf(" %s", f.c_str());
  std::printf("\n");
  const auto t0 = std::chrono::steady_clock::now();
  const bench::HistorySet hist = bench::build_history(sh, opt.n_layers, max_batch, max_ctx,
                                                      wants("int8s") || wants("hybrid"), wants("lossless13"), threads);
  std::printf("  history ready in %.1f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());

  // One engine per mode, reused across configurations (resident copies the pool to the GPU once).
  std::vector<std::string> modes{"resident"};  // first: the bitwise reference for the streamed modes
  for (const auto& m : opt.modes)
    if (m != "resident") modes.push_back(m);
  const bool want_resident = std::find(opt.modes.begin(), opt.modes.end(), "resident") != opt.modes.end();
  std::map<std::string, std::unique_ptr<DecodeEngine>> engines;
  for (const auto& mode : modes) {
    EngineConfig c;
    c.n_layers = opt.n_layers;
    c.attn = sh;
    c.mode = mode == "resident" ? Mode::resident : Mode::streamed;
    c.tile_pages = mode == "streamed-whole" ? 0 : opt.tile_pages;
    c.ring_slots = mode == "streamed-whole" ? 2 : opt.ring_slots;
    c.int8s = opt.int8s;
    try {
      engines[mode] = std::make_unique<DecodeEngine>(c, *hist.pool);
    } catch (const CudaError& e) {
      std::printf("  skip mode %s: %s\n", mode.c_str(), e.what());
    }
  }
  cudaEvent_t ev0, ev1;
  AKV_CUDA(cudaEventCreate(&ev0));
  AKV_CUDA(cudaEventCreate(&ev1));

  std::vector<Record> records;
  bool all_equal = true;
  for (const auto& format : opt.formats) {
    for (int batch : opt.batches) {
      for (int64_t ctx : opt.contexts) {
        const std::vector<SeqPages> seqs =
            bench::route_tables(hist, format, batch, ctx, opt.n_layers, sh.page_size, opt.recent_pages);
        const size_t qn = size_t(opt.n_layers) * batch * sh.n_q_heads() * sh.head_dim;
        DevBuf q(qn * sizeof(float)), out(qn * sizeof(float));
        fill_device_random(q.as<float>(), qn, uint64_t(ctx) * 31 + batch);
        std::vector<float> ref, cur, again;
        const int64_t splits = (ctx + sh.split_tokens - 1) / sh.split_tokens;
        for (const auto& mode : modes) {
          if (!engines.count(mode)) continue;
          DecodeEngine& eng = *engines[mode];
          try {
            eng.set_batch(seqs);
          } catch (const CudaError& e) {
            std::printf("  skip %s %s depth %lld batch %d: %s\n", format.c_str(), mode.c_str(),
                        static_cast<long long>(ctx), batch, e.what());
            continue;
          }
          std::vector<double> ms, dms;
          for (int i = 0; i < opt.warmup + opt.steps; ++i) {
            AKV_CUDA(cudaMemset(out.p, 0xff, qn * sizeof(float)));  // poison: every element must be rewritten
            eng.synchronize();
            AKV_CUDA(cudaDeviceSynchronize());
            const auto a = std::chrono::steady_clock::now();
            AKV_CUDA(cudaEventRecord(ev0, eng.compute_stream()));
            eng.enqueue_step(q.as<float>(), out.as<float>(), nullptr);
            AKV_CUDA(cudaEventRecord(ev1, eng.compute_stream()));
            AKV_CUDA(cudaStreamSynchronize(eng.compute_stream()));
            const auto b = std::chrono::steady_clock::now();
            float dev = 0;
            AKV_CUDA(cudaEventElapsedTime(&dev, ev0, ev1));
            if (i >= opt.warmup) {
              ms.push_back(std::chrono::duration<double, std::milli>(b - a).count());
              dms.push_back(dev);
            }
            if (i == opt.warmup || i == opt.warmup + opt.steps - 1) {
              std::vector<float>& dst = i == opt.warmup ? cur : again;
              dst.resize(qn);
              AKV_CUDA(cudaMemcpy(dst.data(), out.p, qn * sizeof(float), cudaMemcpyDeviceToHost));
            }
          }
          if (mode == "resident") ref = cur;
          if (mode == "resident" && !want_resident) continue;  // measured only as the reference
          Record r{};
          r.format = format;
          r.mode = mode;
          r.context = ctx;
          r.batch = batch;
          r.step_ms = median(ms);
          r.device_ms = median(dms);
          r.step_ms_min = *std::min_element(ms.begin(), ms.end());
          r.step_ms_max = *std::max_element(ms.begin(), ms.end());
          const bool streamed = mode != "resident";
          r.history_bytes = 0;
          for (int l = 0; l < opt.n_layers; ++l)
            for (const auto& ji : eng.job_info(l))
              for (size_t b : ji.copy_bytes) r.history_bytes += double(b);
          if (!streamed) {  // same tables: count the bytes a streamed step would move
            r.history_bytes = 0;
            for (const auto& s : seqs)
              for (const auto& t : s.tables)
                for (const auto& p : t) r.history_bytes += double((p.bytes + 255) / 256 * 256);
          }
          r.bytes_per_step = streamed ? double(eng.bytes_per_step()) : 0.0;
          r.copies_per_step = eng.copies_per_step();
          r.largest_copy = eng.largest_copy();
          r.jobs_per_layer = eng.jobs_per_layer();
          r.gbps = r.history_bytes / (r.step_ms * 1e6);
          const double chunk = streamed ? double(eng.largest_copy()) : double(opt.tile_pages) * sh.page_bytes();
          r.chunk_gbps = pr.bandwidth_gbps(chunk);
          r.bus_limit_ms = r.history_bytes / (r.chunk_gbps * 1e6);
          r.bus_limit_ratio = r.step_ms / r.bus_limit_ms;
          r.predicted_ms = predict_ms(pr, eng, opt.n_layers, splits);
          r.bitwise_equal_resident = !ref.empty() && std::memcmp(ref.data(), cur.data(), qn * sizeof(float)) == 0;
          r.repeatable = std::memcmp(cur.data(), again.data(), qn * sizeof(float)) == 0;
          bool finite = true;
          for (float v : cur) finite = finite && std::isfinite(v);
          if (!r.bitwise_equal_resident || !r.repeatable || !finite) all_equal = false;
          records.push_back(r);
          std::printf("  %-10s %-15s depth %7lld batch %d: %9.3f ms (min %.3f max %.3f, device %.3f), pred %.3f ms, "
                      "bus %.3f ms, ratio %.3f, bitwise==resident %s, repeatable %s\n",
                      format.c_str(), mode.c_str(), static_cast<long long>(ctx), batch, r.step_ms, r.step_ms_min,
                      r.step_ms_max, r.device_ms, r.predicted_ms, r.bus_limit_ms, r.bus_limit_ratio,
                      r.bitwise_equal_resident ? "yes" : "NO", r.repeatable ? "yes" : "NO");
          std::fflush(stdout);
        }
      }
    }
  }
  cudaEventDestroy(ev0);
  cudaEventDestroy(ev1);
  print_table(records);
  print_batching(records);
  if (!opt.json_path.empty()) write_json(opt, pr, hist, records);
  return all_equal ? 0 : 1;
}

}  // namespace activekv::cuda
