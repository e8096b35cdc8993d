// CPU decode attention over pages in place (activekv/cpu/decode_attention.h)
// against the host's own read bandwidth, measured in the same run.
//
// A "step" attends every layer once: `layers` separate page lists of
// `context` tokens each (the 27B attention shape by default: 4 KV heads x 256,
// 24 query heads, pages of 1024 tokens), so a step reads layers x context
// tokens of history -- 2 GiB bf16 at 32K x 16 layers, far beyond the LLC, like
// a real decode step. History GB/s = bytes of history read per step / step
// time (median of --reps after one warm-up step). Read bandwidth: the same
// threads summing a --read-mib buffer (64-byte loads, four accumulators, each
// byte once per pass; median of --reps passes after one warm-up). ratio = history GB/s / read GB/s
// at the same thread count (target >= 0.8, issue 12). Both are also given per
// second of process CPU time: on a loaded machine, where threads wait for a
// core, that rate still says what the code does when it runs (OpenMP threads
// spinning at a barrier count as CPU time, though).
//
//   bench_cpu_attention [--contexts 8192,32768] [--threads 1,2,4,...] [--formats bf16,int8s]
//                       [--layers 16] [--reps 5] [--read-mib 2048] [--json out.json]
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <utility>

#include "activekv/core/error.h"
#include "activekv/cpu/decode_attention.h"
#include "activekv/kv/codec_int8s.h"
#include "activekv/kv/host_memory.h"
#include "activekv/kv/page_store.h"
#include "provenance.h"

namespace {

using namespace activekv;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// CPU time of the whole process (all threads), seconds: beside the wall time
// it shows whether the threads ran or waited (a loaded machine).
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Sums n 64-bit words: the streaming read. Four independent 64-byte
// accumulators (AVX-512 where the CPU has it), so the loop is limited by
// memory, not by an add chain or 16-byte loads.
#if defined(__x86_64__)
__attribute__((target("avx512f"))) uint64_t sum_words_avx512(const uint64_t* p, size_t n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(p + i));
    a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(p + i + 8));
    a2 = _mm512_add_epi64(a2, _mm512_loadu_si512(p + i + 16));
    a3 = _mm512_add_epi64(a3, _mm512_loadu_si512(p + i + 24));
  }
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
  uint64_t s = 0;
  for (uint64_t x : lanes) s += x;
  for (; i < n; ++i) s += p[i];
  return s;
}
#endif
uint64_t sum_words_plain(const uint64_t* p, size_t n) {
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += p[i];
    s1 += p[i + 1];
    s2 += p[i + 2];
    s3 += p[i + 3];
  }
  for (; i < n; ++i) s0 += p[i];
  return s0 + s1 + s2 + s3;
}

struct Rate {
  double gbps = 0;          // bytes / wall second (median)
  double gbps_per_cpu = 0;  // bytes / process CPU second (median)
};

// Host read bandwidth: `threads` threads each sum a contiguous slice of `buf`.
Rate read_gbps(const std::vector<uint64_t>& buf, int threads, int reps) {
#if defined(__x86_64__)
  const auto sum = __builtin_cpu_supports("avx512f") ? sum_words_avx512 : sum_words_plain;
#else
  const auto sum = sum_words_plain;
#endif
  std::vector<double> t, cpu_t;
  uint64_t sink = 0;
  for (int r = 0; r <= reps; ++r) {
    const auto t0 = Clock::now();
    const double c0 = process_cpu_seconds();
    uint64_t total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
      const size_t n = buf.size(), nt = size_t(omp_get_num_threads()), i = size_t(omp_get_thread_num());
      const size_t begin = n * i / nt, end = n * (i + 1) / nt;
      total += sum(buf.data() + begin, end - begin);
    }
    const double s = seconds_since(t0), cpu_s = process_cpu_seconds() - c0;
    sink += total;
    if (r > 0) {
      t.push_back(s);
      cpu_t.push_back(cpu_s);
    }
  }
  if (sink == 42) std::puts("");  // keeps the sum alive
  const double bytes = double(buf.size() * 8);
  return {bytes / median(t) / 1e9, bytes / median(cpu_t) / 1e9};
}

// Random bf16 page contents (N(0,1)-ish values from a cheap generator).
std::vector<bf16> random_page(const kv::KvShape& s, uint32_t seed) {
  std::vector<bf16> p(s.page_elements());
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  for (bf16& x : p) x = f32_to_bf16(n01(rng));
  return p;
}

// The history of every layer in one format: pages back to back per layer
// (separate copies, so no page is read from cache by another layer).
// A layer's history bytes (kv::map_2mib_aligned), in transparent huge pages
// with --huge-pages.
class LayerBytes {
 public:
  LayerBytes(size_t n, bool huge) : n_(n), data_(kv::map_2mib_aligned(n, huge)) {
    if (!data_) throw activekv::Error(fmt::format("mapping {} bytes of history failed", n));
  }
  LayerBytes(LayerBytes&& o) noexcept : n_(o.n_), data_(std::exchange(o.data_, nullptr)) {}
  LayerBytes(const LayerBytes&) = delete;
  ~LayerBytes() { kv::unmap_2mib_aligned(data_, n_); }
  std::byte* data() const { return data_; }

 private:
  size_t n_;
  std::byte* data_;
};

struct History {
  std::vector<LayerBytes> layer_bytes;
  std::vector<std::vector<kv::Int8sPageView>> views;  // int8s only
  std::vector<std::vector<cpu::PageRef>> lists;       // [layer] page list
};

History make_history(const kv::KvShape& s, const std::string& format, int layers, int context, bool huge) {
  const int n_pages = (context + s.page_size - 1) / s.page_size;
  // Two distinct template pages, copied everywhere (encoding every page would take minutes).
  std::vector<std::vector<std::byte>> templates;
  for (uint32_t seed : {1u, 2u}) {
    const std::vector<bf16> page = random_page(s, seed);
    if (format == "bf16") {
      const auto* b = reinterpret_cast<const std::byte*>(page.data());
      templates.emplace_back(b, b + page.size() * sizeof(bf16));
    } else {
      templates.push_back(kv::encode_int8s_page(s, page, s.page_size).bytes);
    }
  }
  const size_t page_bytes = templates[0].size();
  History h;
  h.views.resize(size_t(layers));
  h.lists.resize(size_t(layers));
  for (int l = 0; l < layers; ++l) {
    const LayerBytes& bytes = h.layer_bytes.emplace_back(page_bytes * size_t(n_pages), huge);
    for (int p = 0; p < n_pages; ++p) {
      std::memcpy(bytes.data() + page_bytes * size_t(p), templates[size_t(p + l) % 2].data(), page_bytes);
    }
    h.views[size_t(l)].reserve(size_t(n_pages));
    for (int p = 0; p < n_pages; ++p) {
      const std::byte* at = bytes.data() + page_bytes * size_t(p);
      const int n = std::min(s.page_size, context - p * s.page_size);
      if (format == "bf16") {
        h.lists[size_t(l)].push_back(cpu::PageRef::from_bf16(reinterpret_cast<const bf16*>(at), n));
      } else {
        h.views[size_t(l)].push_back(kv::parse_int8s_page(std::span<const std::byte>(at, page_bytes)));
        h.lists[size_t(l)].push_back(cpu::PageRef::from_int8s(h.views[size_t(l)].back(), n));
      }
    }
  }
  return h;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

}  // namespace

int main(int argc, char** argv) try {
  cli::set_command_line(argc, argv);
  CLI::App app{"CPU decode attention over pages in place vs the host's read bandwidth"};
  std::vector<int> contexts{8192, 32768}, threads_list;
  std::vector<std::string> formats{"bf16", "int8s"};
  int layers = 16, reps = 5, read_mib = 2048, kv_heads = 4, group = 6, head_dim = 256, page_size = 1024,
      split_tokens = 256;
  std::string isa_name = "automatic", json_path;
  app.add_option("--contexts", contexts, "history tokens per layer, comma-separated")->delimiter(',');
  app.add_option("--threads", threads_list, "thread counts (default 1, 2, 4, ... up to all cores)")->delimiter(',');
  app.add_option("--formats", formats, "bf16 and/or int8s")->delimiter(',');
  app.add_option("--layers", layers, "layers per step (separate histories)")->check(CLI::Range(1, 1024));
  app.add_option("--reps", reps, "timed steps per row (median)")->check(CLI::Range(1, 1000));
  app.add_option("--read-mib", read_mib, "read-bandwidth buffer, MiB (>> LLC)")->check(CLI::Range(16, 1 << 20));
  app.add_option("--kv-heads", kv_heads)->check(CLI::Range(1, 64));
  app.add_option("--group", group, "query heads per KV head")->check(CLI::Range(1, 64));
  app.add_option("--head-dim", head_dim)->check(CLI::Range(1, 1024));
  app.add_option("--page-size", page_size)->check(CLI::Range(1, 1 << 20));
  app.add_option("--split-tokens", split_tokens)->check(CLI::Range(1, 1 << 20));
  app.add_option("--isa", isa_name, "automatic, amx, avx512 or portable")
      ->check(CLI::IsMember({"automatic", "amx", "avx512", "portable"}));
  bool huge_pages = false;
  app.add_flag("--huge-pages", huge_pages,
               "history in transparent huge pages (madvise(MADV_HUGEPAGE) before the first touch)");
  app.add_option("--json", json_path, "write the results as JSON here");
  CLI11_PARSE(app, argc, argv);
  for (const std::string& f : formats) {
    if (f != "bf16" && f != "int8s") throw InvalidArgument(fmt::format("--formats: unknown format '{}'", f));
  }
  for (int c : contexts) {
    if (c <= 0) throw InvalidArgument(fmt::format("--contexts: {} is not positive", c));
  }
  const int cores = int(std::thread::hardware_concurrency());
  if (threads_list.empty()) {
    for (int t = 1; t < cores; t *= 2) threads_list.push_back(t);
    threads_list.push_back(cores);
  }
  cpu::CpuAttentionOptions opt;
  opt.split_tokens = split_tokens;
  opt.isa = isa_name == "avx512"     ? cpu::Isa::avx512
            : isa_name == "amx"      ? cpu::Isa::amx
            : isa_name == "portable" ? cpu::Isa::portable
                                     : cpu::Isa::automatic;

  kv::KvShape ks;
  ks.n_layers = 1;
  ks.n_kv_heads = kv_heads;
  ks.head_dim = head_dim;
  ks.page_size = page_size;
  const cpu::DecodeShape shape{kv_heads, group, head_dim, page_size, 0.0f};

  // Host read bandwidth, per thread count.
  std::vector<Rate> read_bw;
  {
    std::vector<uint64_t> buf(size_t(read_mib) << 17);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = i * 0x9E3779B97F4A7C15ull;
    for (int t : threads_list) {
      read_bw.push_back(read_gbps(buf, t, reps));
      fmt::print("read bandwidth, {:3d} threads: {:7.2f} GB/s ({:.2f} GB/s per CPU-second)\n", t, read_bw.back().gbps,
                 read_bw.back().gbps_per_cpu);
    }
  }

  nlohmann::json rows = nlohmann::json::array();
  std::vector<float> q(size_t(shape.n_q_heads()) * head_dim);
  std::mt19937 rng(3);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  for (float& x : q) x = n01(rng);
  std::vector<float> o(q.size()), lse(size_t(shape.n_q_heads()));
  for (const std::string& format : formats) {
    for (int context : contexts) {
      const History h = make_history(ks, format, layers, context, huge_pages);
      const size_t step_bytes = cpu::history_bytes(shape, h.lists[0]) * size_t(layers);
      for (size_t ti = 0; ti < threads_list.size(); ++ti) {
        opt.threads = threads_list[ti];
        cpu::CpuAttentionWorkspace ws;
        std::vector<double> t, cpu_t;
        for (int r = 0; r <= reps; ++r) {
          const auto t0 = Clock::now();
          const double c0 = process_cpu_seconds();
          for (int l = 0; l < layers; ++l) cpu::attend_pages(shape, h.lists[size_t(l)], q.data(), opt, ws, o.data(), lse.data());
          if (r > 0) {
            t.push_back(seconds_since(t0));
            cpu_t.push_back(process_cpu_seconds() - c0);
          }
        }
        const double step_s = median(t), cpu_s = median(cpu_t);
        const double gbps = double(step_bytes) / step_s / 1e9;
        const double ratio = gbps / read_bw[ti].gbps;
        fmt::print("{:5s} {:6d} tokens x {} layers, {:3d} threads: {:8.3f} ms/layer, {:7.2f} GB/s of history, "
                   "{:5.1f} % of read bandwidth; {:7.2f} GB/s per CPU-second\n",
                   format, context, layers, threads_list[ti], step_s / layers * 1e3, gbps, 100 * ratio,
                   double(step_bytes) / cpu_s / 1e9);
        rows.push_back({{"format", format},
                        {"context", context},
                        {"layers", layers},
                        {"threads", threads_list[ti]},
                        {"ms_per_layer", step_s / layers * 1e3},
                        {"ms_per_step", step_s * 1e3},
                        {"cpu_ms_per_step", cpu_s * 1e3},
                        {"history_bytes_per_step", step_bytes},
                        {"history_gbps", gbps},
                        {"history_gbps_per_cpu_second", double(step_bytes) / cpu_s / 1e9},
                        {"read_gbps", read_bw[ti].gbps},
                        {"ratio", ratio}});
      }
    }
  }
  if (!json_path.empty()) {
    nlohmann::json j = {{"bench", "cpu_attention"},
                        {"commit", cli::git_commit()},
                        {"command", cli::command_line()},
                        {"cpu", cpu_model()},
                        {"cores", cores},
                        {"kernels", cpu::kernels_name(shape, opt.isa)},
                        {"shape", {{"n_kv_heads", kv_heads}, {"group", group}, {"head_dim", head_dim},
                                   {"page_size", page_size}, {"split_tokens", split_tokens}}},
                        {"read_mib", read_mib},
                        {"huge_pages", huge_pages},
                        {"reps", reps},
                        {"read_bandwidth", nlohmann::json::array()},
                        {"rows", rows}};
    for (size_t ti = 0; ti < threads_list.size(); ++ti) {
      j["read_bandwidth"].push_back({{"threads", threads_list[ti]},
                                     {"gbps", read_bw[ti].gbps},
                                     {"gbps_per_cpu_second", read_bw[ti].gbps_per_cpu}});
    }
    std::ofstream(json_path) << j.dump(2) << "\n";
    if (!std::ofstream(json_path, std::ios::app)) throw Error(fmt::format("cannot write {}", json_path));
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_cpu_attention: %s\n", e.what());
  return 1;
}
