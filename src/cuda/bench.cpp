// calibrate + bench decode. See include/activekv/cuda/bench.h.
#include "activekv/cuda/bench.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "activekv/cuda/decode_engine.h"

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

}  // namespace

double Profile::bandwidth_gbps(double bytes) const { return interp(copy_bytes, copy_gbps, bytes, true, false); }
double Profile::kernel_time_ms(double tokens) const {
  return std::max(0.0, interp(kernel_tokens, kernel_ms, tokens, false, true));
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
    << "  \"model\": \"t_copy(b) = b / B(b) (B: back-to-back pinned H2D bandwidth at copy size b, log-size interpolation); "
       "step = job-by-job simulation of the copy stream and the compute stream with ring-slot waits\"\n}\n";
  return o.str();
}

Profile calibrate(const CalibrateOptions& opt) {
  AKV_CUDA(cudaSetDevice(opt.device));
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
      double end = start + pr.kernel_time_ms(double(jobs[j].tokens));
      if (j + 1 == jobs.size()) end += pr.merge_time_ms(double(splits_per_seq));
      comp_end.push_back(end);
      comp_free = end;
    }
  }
  return comp_free;
}

}  // namespace

int run_bench_decode(const BenchDecodeOptions& opt) {
  AKV_CUDA(cudaSetDevice(opt.device));
  const AttnShape& sh = opt.attn;
  sh.validate();
  for (const auto& m : opt.modes)
    if (m != "streamed" && m != "resident" && m != "streamed-whole")
      throw InvalidArgument("bench decode: unknown mode '" + m + "' (streamed, streamed-whole, resident)");
  if (opt.steps < 1 || opt.warmup < 0) throw InvalidArgument("bench decode: steps must be >= 1, warmup >= 0");
  const int threads = opt.host_threads > 0 ? opt.host_threads : int(std::max(1u, std::thread::hardware_concurrency()));

  CalibrateOptions copt;
  copt.attn = sh;
  copt.out_path = opt.profile_path;
  copt.device = opt.device;
  const Profile pr = calibrate(copt);

  const int64_t max_ctx = *std::max_element(opt.contexts.begin(), opt.contexts.end());
  const int max_batch = *std::max_element(opt.batches.begin(), opt.batches.end());
  const int64_t pages_per_seq_layer = (max_ctx + sh.page_size - 1) / sh.page_size;
  const size_t n_pages = size_t(pages_per_seq_layer) * opt.n_layers * max_batch;
  std::printf("\nbench decode: %d layers, %d KV heads x %d, %d query heads, bf16, page %d tokens (%.1f MiB)\n",
              opt.n_layers, sh.n_kv_heads, sh.head_dim, sh.n_q_heads(), sh.page_size, sh.page_bytes() / 1048576.0);
  std::printf("  pinning %.2f GiB of host history...\n", double(n_pages) * sh.page_bytes() / double(1ull << 30));
  std::fflush(stdout);
  auto t0 = std::chrono::steady_clock::now();
  PinnedPagePool pool(sh.page_bytes(), n_pages);
  auto t1 = std::chrono::steady_clock::now();
  fill_random_bf16(pool.data(), n_pages * sh.page_bytes(), 42, threads);
  auto t2 = std::chrono::steady_clock::now();
  std::printf("  pinned in %.1f s, filled in %.1f s\n", std::chrono::duration<double>(t1 - t0).count(),
              std::chrono::duration<double>(t2 - t1).count());

  auto make_engine = [&](const std::string& mode) {
    EngineConfig c;
    c.n_layers = opt.n_layers;
    c.attn = sh;
    c.mode = mode == "resident" ? Mode::resident : Mode::streamed;
    c.tile_pages = mode == "streamed-whole" ? 0 : opt.tile_pages;
    c.ring_slots = mode == "streamed-whole" ? 2 : opt.ring_slots;
    return std::make_unique<DecodeEngine>(c, pool);
  };
  // Resident first: it is the bitwise reference for the streamed modes.
  std::vector<std::string> modes;
  const bool want_resident = std::find(opt.modes.begin(), opt.modes.end(), "resident") != opt.modes.end();
  modes.push_back("resident");
  for (const auto& m : opt.modes)
    if (m != "resident") modes.push_back(m);

  std::vector<Record> records;
  bool all_equal = true;
  for (int batch : opt.batches) {
    for (int64_t ctx : opt.contexts) {
      std::vector<SeqPages> seqs(batch);
      for (int s = 0; s < batch; ++s) {
        seqs[s].n_tokens = ctx;
        seqs[s].tables.resize(opt.n_layers);
        const int64_t np = (ctx + sh.page_size - 1) / sh.page_size;
        for (int l = 0; l < opt.n_layers; ++l)
          for (int64_t p = 0; p < np; ++p)
            seqs[s].tables[l].push_back(uint32_t((int64_t(s) * opt.n_layers + l) * pages_per_seq_layer + p));
      }
      const size_t qn = size_t(opt.n_layers) * batch * sh.n_q_heads() * sh.head_dim;
      DevBuf q(qn * sizeof(float)), out(qn * sizeof(float));
      fill_device_random(q.as<float>(), qn, uint64_t(ctx) * 31 + batch);
      std::vector<float> ref, cur, again;
      const int64_t splits = (ctx + sh.split_tokens - 1) / sh.split_tokens;
      for (const auto& mode : modes) {
        if (mode == "resident" && !want_resident && !ref.empty()) continue;
        std::unique_ptr<DecodeEngine> eng;
        try {
          eng = make_engine(mode);
          eng->set_batch(seqs);
        } catch (const CudaError& e) {
          std::printf("  skip %s depth %lld batch %d: %s\n", mode.c_str(), static_cast<long long>(ctx), batch, e.what());
          continue;
        }
        std::vector<double> ms;
        for (int i = 0; i < opt.warmup + opt.steps; ++i) {
          AKV_CUDA(cudaMemset(out.p, 0xff, qn * sizeof(float)));  // poison: every element must be rewritten
          eng->synchronize();
          AKV_CUDA(cudaDeviceSynchronize());
          const auto a = std::chrono::steady_clock::now();
          eng->enqueue_step(q.as<float>(), out.as<float>(), nullptr);
          AKV_CUDA(cudaStreamSynchronize(eng->compute_stream()));
          const auto b = std::chrono::steady_clock::now();
          if (i >= opt.warmup) ms.push_back(std::chrono::duration<double, std::milli>(b - a).count());
          if (i == opt.warmup || i == opt.warmup + opt.steps - 1) {
            std::vector<float>& dst = i == opt.warmup ? cur : again;
            dst.resize(qn);
            AKV_CUDA(cudaMemcpy(dst.data(), out.p, qn * sizeof(float), cudaMemcpyDeviceToHost));
          }
        }
        if (mode == "resident") ref = cur;
        Record r{};
        r.format = "bf16";
        r.mode = mode;
        r.context = ctx;
        r.batch = batch;
        r.step_ms = median(ms);
        r.step_ms_min = *std::min_element(ms.begin(), ms.end());
        r.step_ms_max = *std::max_element(ms.begin(), ms.end());
        const bool streamed = mode != "resident";
        const double history_bytes = double(ctx) * batch * opt.n_layers * 2 * sh.n_kv_heads * sh.head_dim * 2;
        r.bytes_per_step = streamed ? double(eng->bytes_per_step()) : 0.0;
        r.copies_per_step = eng->copies_per_step();
        r.largest_copy = eng->largest_copy();
        r.jobs_per_layer = eng->jobs_per_layer();
        // gbps: history bytes attended per second (= bytes moved across PCIe for the streamed modes)
        r.gbps = history_bytes / (r.step_ms * 1e6);
        const double chunk = streamed ? double(eng->largest_copy()) : double(opt.tile_pages) * sh.page_bytes();
        r.chunk_gbps = pr.bandwidth_gbps(chunk);
        r.bus_limit_ms = history_bytes / (r.chunk_gbps * 1e6);
        r.bus_limit_ratio = r.step_ms / r.bus_limit_ms;
        r.predicted_ms = predict_ms(pr, *eng, opt.n_layers, splits);
        r.bitwise_equal_resident = !ref.empty() && std::memcmp(ref.data(), cur.data(), qn * sizeof(float)) == 0;
        r.repeatable = std::memcmp(cur.data(), again.data(), qn * sizeof(float)) == 0;
        bool finite = true;
        for (float v : cur) finite = finite && std::isfinite(v);
        if (!r.bitwise_equal_resident || !r.repeatable || !finite) all_equal = false;
        records.push_back(r);
        std::printf("  %-15s depth %7lld batch %d: %9.3f ms (min %.3f max %.3f), pred %.3f ms, bus %.3f ms, ratio %.3f, "
                    "bitwise==resident %s, repeatable %s\n",
                    mode.c_str(), static_cast<long long>(ctx), batch, r.step_ms, r.step_ms_min, r.step_ms_max,
                    r.predicted_ms, r.bus_limit_ms, r.bus_limit_ratio, r.bitwise_equal_resident ? "yes" : "NO",
                    r.repeatable ? "yes" : "NO");
        std::fflush(stdout);
      }
    }
  }

  // Table (llama-bench vocabulary: depth = context tokens, t/s = tokens generated per second).
  std::printf("\n| %-15s | %7s | %5s | %9s | %17s | %8s | %7s | %9s | %6s | %9s | %6s |\n", "mode", "depth", "batch",
              "step ms", "min - max", "t/s", "GB/s", "bus ms", "ratio", "pred ms", "err %");
  std::printf("|%s|\n", std::string(127, '-').c_str());
  for (const auto& r : records)
    std::printf("| %-15s | %7lld | %5d | %9.3f | %8.3f - %6.3f | %8.2f | %7.1f | %9.3f | %6.3f | %9.3f | %6.2f |\n",
                r.mode.c_str(), static_cast<long long>(r.context), r.batch, r.step_ms, r.step_ms_min, r.step_ms_max,
                r.batch * 1000.0 / r.step_ms, r.gbps, r.bus_limit_ms, r.bus_limit_ratio, r.predicted_ms,
                100.0 * (r.predicted_ms - r.step_ms) / r.step_ms);

  if (!opt.json_path.empty()) {
    std::ofstream f(opt.json_path);
    if (!f) throw Error("bench decode: cannot write " + opt.json_path);
    f << "{\n  \"device\": " << jstr(pr.device) << ",\n  \"commit\": " << jstr(opt.commit)
      << ",\n  \"command\": " << jstr(opt.command) << ",\n  \"shape\": {\"n_layers\": " << opt.n_layers
      << ", \"n_kv_heads\": " << sh.n_kv_heads << ", \"n_q_heads\": " << sh.n_q_heads()
      << ", \"head_dim\": " << sh.head_dim << ", \"page_size\": " << sh.page_size
      << ", \"split_tokens\": " << sh.split_tokens << ", \"tile_pages\": " << opt.tile_pages
      << ", \"ring_slots\": " << opt.ring_slots << "},\n  \"profile\": " << pr.to_json() << ",\n  \"records\": [\n";
    for (size_t i = 0; i < records.size(); ++i) {
      const Record& r = records[i];
      f << "    {\"format\": " << jstr(r.format + (r.mode == "resident" ? "-resident" : "-" + r.mode))
        << ", \"tier\": \"bf16\", \"mode\": " << jstr(r.mode) << ", \"context\": " << r.context
        << ", \"depth\": " << r.context << ", \"batch\": " << r.batch << ", \"step_ms\": " << jnum(r.step_ms)
        << ", \"step_ms_min\": " << jnum(r.step_ms_min) << ", \"step_ms_max\": " << jnum(r.step_ms_max)
        << ", \"steps\": " << opt.steps << ", \"t_per_s\": " << jnum(r.batch * 1000.0 / r.step_ms)
        << ", \"bytes_per_step\": " << jnum(r.bytes_per_step) << ", \"gbps\": " << jnum(r.gbps)
        << ", \"copies_per_step\": " << r.copies_per_step << ", \"largest_copy\": " << r.largest_copy
        << ", \"jobs_per_layer\": " << r.jobs_per_layer << ", \"chunk_gbps\": " << jnum(r.chunk_gbps)
        << ", \"bus_limit_ms\": " << jnum(r.bus_limit_ms) << ", \"bus_limit_ratio\": " << jnum(r.bus_limit_ratio)
        << ", \"predicted_ms\": " << jnum(r.predicted_ms)
        << ", \"prediction_error\": " << jnum((r.predicted_ms - r.step_ms) / r.step_ms)
        << ", \"bitwise_equal_resident\": " << (r.bitwise_equal_resident ? "true" : "false")
        << ", \"repeatable\": " << (r.repeatable ? "true" : "false") << ", \"device\": " << jstr(pr.device)
        << ", \"commit\": " << jstr(opt.commit) << ", \"command\": " << jstr(opt.command) << "}"
        << (i + 1 < records.size() ? ",\n" : "\n");
    }
    f << "  ]\n}\n";
    std::printf("\nJSON written to %s\n", opt.json_path.c_str());
  }
  return all_equal ? 0 : 1;
}

}  // namespace activekv::cuda
