// CPU prefill attention (activekv/cpu/prefill_attention.h) against the path it
// replaced in the CPU model (attention::attend_tile: sgemms over fp32 copies
// of the pages) and against this machine's fused multiply-add peak, measured
// in the same run: one chunk of --rows query rows at the end of a history of
// depth + rows tokens, one layer, bf16 pages (SmolLM2-135M's shape by
// default: 3 KV heads x 64, 9 query heads, pages of 1024 tokens).
//
// GFLOP/s counts the attention's useful work, 4 x head_dim flops per (query
// head, visible key) -- q.k and p.v, causal: row r sees depth + r + 1 keys.
// The FMA peak: the same threads each running 12 independent 8-lane FMA
// chains (AVX2; 16 flops per FMA) for ~0.2 s. Times: minimum and median of --reps
// calls after one warm-up.
//
//   bench_cpu_prefill [--depths 0,1024,4096] [--rows 256] [--threads 2] [--reps 5] [--json out.json]
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "activekv/attention/paged_attention.h"
#include "activekv/core/error.h"
#include "activekv/cpu/prefill_attention.h"
#include "activekv/kv/page_store.h"
#include "provenance.h"

namespace {

using namespace activekv;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Twelve independent chains: enough to cover an FMA latency of 4-5 cycles on
// two pipes (Zen 2 needs 10; 8 left its peak ~30 % short).
__attribute__((target("avx2,fma"))) double fma_chains(double seconds) {
  constexpr int kChains = 12;
  __m256 a[kChains];
  for (int i = 0; i < kChains; ++i) a[i] = _mm256_set1_ps(1.0f + 1e-7f * float(i));
  const __m256 m = _mm256_set1_ps(0.9999999f), c = _mm256_set1_ps(1e-7f);
  long iters = 0;
  const auto t0 = Clock::now();
  do {
    for (int k = 0; k < 1000; ++k) {
      for (int i = 0; i < kChains; ++i) a[i] = _mm256_fmadd_ps(a[i], m, c);
    }
    iters += 1000;
  } while (seconds_since(t0) < seconds);
  float sink = 0;
  for (int i = 0; i < kChains; ++i) sink += _mm256_cvtss_f32(a[i]);
  if (sink == 12345.0f) std::puts("");  // keeps the chains alive
  return double(iters) * kChains * 16 / seconds_since(t0);
}

// GFLOP/s of `threads` threads running FMA chains at once.
double fma_peak_gflops(int threads) {
  if (!cpu::cpu_has_avx2_fma_kernels()) return 0;
  double total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
  total += fma_chains(0.2);
  return total / 1e9;
}

struct Timing {
  double min_ms, median_ms;
};

template <class F>
Timing time_calls(int reps, F&& f) {
  f();  // warm-up
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    f();
    ms.push_back(1e3 * seconds_since(t0));
  }
  std::sort(ms.begin(), ms.end());
  return {ms.front(), ms[ms.size() / 2]};
}

}  // namespace

int main(int argc, char** argv) try {
  cli::set_command_line(argc, argv);
  CLI::App app{"CPU prefill attention vs attend_tile and the FMA peak"};
  std::vector<int> depths{0, 1024, 4096};
  int rows = 256, threads = 2, reps = 5, kv_heads = 3, group = 3, head_dim = 64, page_size = 1024;
  std::string json_path;
  app.add_option("--depths", depths, "history tokens before the chunk, comma-separated")->delimiter(',');
  app.add_option("--rows", rows, "query rows (the prefill chunk)")->check(CLI::Range(1, 1 << 16));
  app.add_option("--threads", threads)->check(CLI::Range(1, 1024));
  app.add_option("--reps", reps, "timed calls per row")->check(CLI::Range(1, 1000));
  app.add_option("--kv-heads", kv_heads)->check(CLI::Range(1, 64));
  app.add_option("--group", group, "query heads per KV head")->check(CLI::Range(1, 64));
  app.add_option("--head-dim", head_dim)->check(CLI::Range(16, 1024));
  app.add_option("--page-size", page_size)->check(CLI::Range(16, 1 << 20));
  app.add_option("--json", json_path, "write the results as JSON here");
  CLI11_PARSE(app, argc, argv);
  omp_set_num_threads(threads);

  const double peak = fma_peak_gflops(threads);
  fmt::print("FMA peak, {} threads: {:.1f} GFLOP/s\n", threads, peak);
  const int nq = kv_heads * group;
  nlohmann::json out_rows = nlohmann::json::array();
  std::mt19937 rng(1);
  std::normal_distribution<float> n01;
  for (const int depth : depths) {
    const int64_t n_tokens = int64_t(depth) + rows;
    kv::PageStore store(kv::KvShape{1, kv_heads, head_dim, page_size, kv::PageFormat::bf16});
    kv::SequenceKv seq(store);
    seq.reserve(n_tokens);
    std::vector<float> k(size_t(n_tokens) * kv_heads * head_dim), v(k.size());
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = n01(rng);
      v[i] = n01(rng);
    }
    seq.write(0, 0, n_tokens, k.data(), v.data());
    seq.commit(n_tokens);
    std::vector<float> q(size_t(rows) * nq * head_dim);
    for (float& x : q) x = n01(rng);
    std::vector<int64_t> pos(static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) pos[size_t(r)] = depth + r;

    const attention::LayerHistory history{&store, seq.page_table(0), n_tokens};
    const attention::QueryRows qrows{q.data(), rows, nq, pos.data()};
    attention::Workspace tile_ws;
    attention::AttentionOptions aopt;
    aopt.tile_pages = 1 << 20;  // one tile: attend_tile over every page, as the CPU model's exact route per tile
    const size_t n_pages = size_t((n_tokens + page_size - 1) / page_size);
    const Timing tile = time_calls(reps, [&] { attention::attend_tile(history, 0, n_pages, qrows, aopt, tile_ws); });

    std::vector<cpu::PageRef> pages;
    for (size_t p = 0; p < n_pages; ++p) {
      const int n = int(std::min<int64_t>(page_size, n_tokens - int64_t(p) * page_size));
      pages.push_back(cpu::PageRef::from_bf16(reinterpret_cast<const bf16*>(store.page_data(seq.page_table(0)[p])), n));
    }
    const cpu::DecodeShape shape{kv_heads, group, head_dim, page_size, 0.0f};
    cpu::PrefillWorkspace ws;
    cpu::PrefillOptions popt;
    popt.threads = threads;
    std::vector<float> o(q.size()), lse(size_t(rows) * nq);
    const Timing fast = time_calls(reps, [&] {
      cpu::attend_prefill(shape, pages, 0, {q.data(), pos.data(), rows, 0}, popt, ws, o.data(), lse.data());
    });

    const double visible = double(rows) * depth + double(rows) * (rows + 1) / 2;  // keys per query head, summed
    const double gflop = 4.0 * head_dim * nq * visible / 1e9;
    const double gflops = gflop / (fast.min_ms / 1e3), tile_gflops = gflop / (tile.min_ms / 1e3);
    fmt::print("depth {:6d}, {} rows: in place {:8.2f} ms (median {:8.2f}), {:6.1f} GFLOP/s = {:4.1f} % of peak; "
               "attend_tile {:8.2f} ms (median {:8.2f}), {:6.1f} GFLOP/s; speed-up {:.2f}x\n",
               depth, rows, fast.min_ms, fast.median_ms, gflops, 100 * gflops / peak, tile.min_ms, tile.median_ms,
               tile_gflops, tile.min_ms / fast.min_ms);
    out_rows.push_back({{"depth", depth},
                        {"rows", rows},
                        {"gflop", gflop},
                        {"in_place_ms_min", fast.min_ms},
                        {"in_place_ms_median", fast.median_ms},
                        {"in_place_gflops", gflops},
                        {"in_place_fraction_of_fma_peak", peak > 0 ? gflops / peak : 0.0},
                        {"attend_tile_ms_min", tile.min_ms},
                        {"attend_tile_ms_median", tile.median_ms},
                        {"attend_tile_gflops", tile_gflops},
                        {"speedup", tile.min_ms / fast.min_ms}});
  }
  if (!json_path.empty()) {
    const nlohmann::json j = {{"bench", "cpu_prefill_attention"},
                              {"commit", cli::git_commit()},
                              {"command", cli::command_line()},
                              {"threads", threads},
                              {"fma_peak_gflops", peak},
                              {"kernel", cpu::cpu_has_avx2_fma_kernels() ? "avx2" : "portable"},
                              {"shape", {{"n_kv_heads", kv_heads}, {"group", group}, {"head_dim", head_dim},
                                         {"page_size", page_size}}},
                              {"reps", reps},
                              {"rows", out_rows}};
    std::ofstream f(json_path);
    f << j.dump(2) << "\n";
    if (!f) throw Error(fmt::format("cannot write {}", json_path));
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_cpu_prefill: %s\n", e.what());
  return 1;
}
