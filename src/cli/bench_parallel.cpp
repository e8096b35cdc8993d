// `activekv bench --parallel` (bench_parallel.h): its checks, its arithmetic
// and the driver that fills the groups and times the steps.
#include "bench_parallel.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <set>

#include "activekv/core/error.h"
#include "memory.h"
#include "stats.h"

namespace activekv::cli {

int batch_rounds(int n, int max_batch) {
  if (n < 1 || max_batch < 1)
    throw InvalidArgument(fmt::format("batch_rounds: {} sequences in batches of {}", n, max_batch));
  return (n + max_batch - 1) / max_batch;
}

std::vector<int> parallel_values(std::vector<int> values) {
  if (values.empty()) throw Error("bench: --parallel needs at least one value");
  std::set<int> seen;
  for (int n : values) {
    if (n < 1 || n > kMaxParallel)
      throw Error(fmt::format("bench: --parallel {}: a count of sequences is in [1, {}]", n, kMaxParallel));
    if (!seen.insert(n).second) throw Error(fmt::format("bench: --parallel {} is given twice", n));
  }
  std::sort(values.begin(), values.end());
  return values;
}

void check_parallel_args(const ModelBenchArgs& a, const std::string& device) {
  if (a.parallel.empty()) {
    if (a.seq_gpu_kv_mem_gib != 0) throw Error("bench: --seq-gpu-kv-mem applies to --parallel only");
    return;
  }
  if (device != "cuda")
    throw Error("bench: --parallel needs a GPU (--device cuda; --device auto finds none usable here, or this build "
                "has no CUDA backend): the CPU path has no batched decode");
  parallel_values(a.parallel);
  if (a.n_gen < 1) throw Error(fmt::format("bench: --parallel times decode steps: -n {} must be > 0", a.n_gen));
  if (a.prompts_given)
    throw Error("bench: --parallel times decode steps only (a pp row is one history's prefill): leave out -p");
  if (a.cuda_graphs == "on")
    throw Error("bench: --parallel runs GpuModel::decode_batch, which launches kernel by kernel: leave out "
                "--cuda-graphs");
  if (!(a.seq_gpu_kv_mem_gib >= 0))
    throw Error(fmt::format("bench: --seq-gpu-kv-mem {}: GiB >= 0", a.seq_gpu_kv_mem_gib));
}

int64_t parallel_context(int64_t depth, int n_rows, int n_gen, int reps) {
  return std::max<int64_t>(depth, 1) + int64_t(n_rows) * (int64_t(reps) * (int64_t(n_gen) + 1) + 1);
}

uint64_t parallel_seq_budget(uint64_t model_budget, int n_max, double seq_gib) {
  if (seq_gib > 0) return uint64_t(seq_gib * double(1ull << 30));
  return model_budget / uint64_t(std::max(1, n_max));
}

void require_parallel_host_memory(int n, uint64_t per_seq, const std::string& what, uint64_t available) {
  const uint64_t total = per_seq > UINT64_MAX / uint64_t(n) ? UINT64_MAX : per_seq * uint64_t(n);
  require_memory(fmt::format("bench --parallel {}: {} histories of {} ({} each)", n, n, what, describe_bytes(per_seq)),
                 total, available);
}

void require_parallel_gpu_budget(int n, const std::string& placement, uint64_t per_seq, uint64_t seq_budget,
                                 uint64_t model_budget, const std::string& what) {
  const uint64_t asked = seq_budget > UINT64_MAX / uint64_t(n) ? UINT64_MAX : seq_budget * uint64_t(n);
  if (asked > model_budget)
    throw Error(fmt::format("bench --parallel {}: {} sequence budgets of {} ask {}; the GPU budget is {} "
                            "(--gpu-kv-mem, or the memory free after the weights less a margin)",
                            n, n, describe_bytes(seq_budget), describe_bytes(asked), describe_bytes(model_budget)));
  if (placement == "gpu" && per_seq > seq_budget)
    throw Error(fmt::format("bench --parallel {} --kv-placement gpu: {} resident histories of {} need {} each ({} in "
                            "all), and each sequence's GPU budget is {} ({} in all: --gpu-kv-mem / {} unless "
                            "--seq-gpu-kv-mem)",
                            n, n, what, describe_bytes(per_seq),
                            describe_bytes(per_seq > UINT64_MAX / uint64_t(n) ? UINT64_MAX : per_seq * uint64_t(n)),
                            describe_bytes(seq_budget), describe_bytes(model_budget), n));
}

ParallelHistory parallel_history(const ModelBenchArgs& a, const model::ModelConfig& c, const std::string& format,
                                 int64_t depth) {
  const int64_t n_ctx = parallel_context(depth, int(a.parallel.size()), a.n_gen, a.reps);
  const kv::KvShape shape{c.n_global_layers(), c.n_kv_heads, c.head_dim, a.page_size, kv::PageFormat::bf16};
  const route::RouteKind kind = format == "bf16" ? route::RouteKind::exact : route::parse_kind(format);
  return {fmt::format("{} tokens of {}", n_ctx, format), routed_history_bytes(shape, kind, n_ctx)};
}

void require_parallel_host_fits(const ModelBenchArgs& a, const model::ModelConfig& c, uint64_t available) {
  const int n_max = parallel_values(a.parallel).back();
  const int64_t deepest = *std::max_element(a.depths.begin(), a.depths.end());
  for (const std::string& format : a.formats) {  // one group at a time: the deepest of each format
    const ParallelHistory h = parallel_history(a, c, format, deepest);
    require_parallel_host_memory(n_max, h.bytes, h.what, available);
  }
}

StepFloor parallel_step_floor(const BenchDevice& d, const std::string& placement, int rounds,
                              double history_bytes_per_step, double resident_bytes_per_step) {
  StepFloor f;
  f.weight_ms = d.weight_bytes * rounds / (d.weight_gbps * 1e6);
  f.history_ms = history_bytes_per_step / (d.history_gbps(placement) * 1e6) +
                 resident_bytes_per_step / (d.weight_gbps * 1e6);
  return f;
}

namespace {

// One step: every one of the first n sequences appends next[s] and next[s]
// becomes the token it sampled; rounds of at most max_batch sequences. With
// `check`, each round's logits are checked right after its forward pass
// (the untimed step after a row, named by `where` and `label`).
void step(ParallelGroup& g, int n, std::vector<int32_t>& next, const std::vector<int>& index, bool check = false,
          const std::string& where = {}, const std::string& label = {}) {
  const int b = g.max_batch();
  for (int s = 0; s < n; s += b) {
    const size_t k = size_t(std::min(b, n - s));
    const std::vector<int32_t> out = g.decode_batch(std::span(index).subspan(size_t(s), k),
                                                    std::span<const int32_t>(next).subspan(size_t(s), k));
    std::copy(out.begin(), out.end(), next.begin() + s);
    for (size_t i = 0; check && i < k; ++i)
      check_finite_logits(g.last_logits(s + int(i)), fmt::format("{} sequence {}", where, s + int(i)), label);
  }
}

int64_t shortest(const ParallelGroup& g, int n) {
  int64_t m = g.n_tokens(0);
  for (int s = 1; s < n; ++s) m = std::min(m, g.n_tokens(s));
  return m;
}

// Fills every sequence of the group to the depth (at least one token), one after another; untimed.
ParallelFill fill_group(ParallelGroup& g, int64_t depth, std::vector<TokenSource>& sources,
                        std::vector<int32_t>& next, ParallelFill f, const std::string& where) {
  f.fill_tokens = std::max<int64_t>(depth, 1);
  for (int s = 0; s < g.size(); ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    next[size_t(s)] = g.prefill(s, sources[size_t(s)].next(f.fill_tokens));
    f.fill_s.push_back(ms_since(t0) / 1000);
    bench_stage(fmt::format("{}: sequence {}/{} filled by prefill of {} random tokens in {:.2f} s ({:.0f} tokens/s)",
                            where, s + 1, g.size(), f.fill_tokens, f.fill_s.back(),
                            double(f.fill_tokens) / f.fill_s.back()));
  }
  const auto t1 = std::chrono::steady_clock::now();
  g.wait_conversions();
  f.conversion_s = ms_since(t1) / 1000;
  const double total = std::accumulate(f.fill_s.begin(), f.fill_s.end(), 0.0);
  bench_stage(fmt::format("{}: {} sequences filled one after another in {:.1f} s ({:.0f} tokens/s); conversion caught "
                          "up {:.1f} s later",
                          where, g.size(), total, double(f.fill_tokens) * g.size() / total, f.conversion_s));
  return f;
}

// One tg row over the first n sequences: per repetition, conversion caught
// up, one untimed warm-up step, then row.n_tokens timed steps.
BenchRow run_row(ParallelGroup& g, int n, const ModelBenchArgs& a, const BenchDevice& d, BenchRow row,
                 std::vector<int32_t>& next, const std::vector<int>& index) {
  row.n_seqs = n;
  row.rounds = batch_rounds(n, g.max_batch());
  row.seq_tokens.assign(size_t(n), {});
  for (auto& t : row.seq_tokens) t.reserve(size_t(a.reps) * size_t(row.n_tokens));
  double bytes = 0, resident = 0;
  for (int r = 0; r < a.reps; ++r) {
    g.wait_conversions();
    step(g, n, next, index);  // warm-up: uploads of newly published pages, first touches
    row.depth_start.push_back(shortest(g, n));
    const double b0 = g.history_bytes(), r0 = g.resident_history_bytes();
    d.mark_timed(true);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < row.n_tokens; ++i) {
      step(g, n, next, index);
      for (int s = 0; s < n; ++s) row.seq_tokens[size_t(s)].push_back(next[size_t(s)]);  // reserved: no allocation
    }
    row.ms.push_back(ms_since(t0));
    d.mark_timed(false);
    bytes += g.history_bytes() - b0;
    resident += g.resident_history_bytes() - r0;
  }
  row.history_bytes_per_token = bytes / double(a.reps) / row.n_tokens;  // per step: all n sequences
  row.resident_bytes_per_token = resident / double(a.reps) / row.n_tokens;
  const StepFloor f =
      parallel_step_floor(d, row.placement, row.rounds, row.history_bytes_per_token, row.resident_bytes_per_token);
  row.weight_floor_ms = f.weight_ms;
  row.history_floor_ms = f.history_ms;
  row.floor_ms = f.total_ms();
  return row;
}

}  // namespace

void run_parallel_rows(const ModelBenchArgs& a, const BenchDevice& d, const model::ModelConfig& c, BenchRun& run) {
  if (!d.open_parallel) throw Error("bench: --parallel needs --device cuda");
  const std::vector<int> ns = parallel_values(a.parallel);
  const int n_max = ns.back();
  const int vocab = c.vocab_size;
  run.parallel = true;
  const uint64_t seq_budget = parallel_seq_budget(d.kv_budget, n_max, a.seq_gpu_kv_mem_gib);
  bench_stage(fmt::format("--parallel {}: GPU budget {} for the histories, {} per sequence{}", fmt::join(ns, ","),
                          describe_bytes(d.kv_budget), describe_bytes(seq_budget),
                          a.seq_gpu_kv_mem_gib > 0 ? " (--seq-gpu-kv-mem)" : fmt::format(" (/ {})", n_max)));
  for (const std::string& format : a.formats)  // before any fill: every group's budgets
    for (const std::string& placement : a.placements)
      for (int64_t depth : a.depths) {
        const ParallelHistory h = parallel_history(a, c, format, depth);
        require_parallel_gpu_budget(n_max, placement, h.bytes, seq_budget, d.kv_budget, h.what);
      }
  for (const std::string& format : a.formats) {
    for (const std::string& placement : a.placements) {
      for (int64_t depth : a.depths) {
        const std::string where = fmt::format("{} {} d{}", format, placement, depth);
        const int64_t n_ctx = parallel_context(depth, int(ns.size()), a.n_gen, a.reps);
        ParallelFill f;
        f.format = format;
        f.requested = placement;
        f.depth = depth;
        f.seq_gpu_budget = seq_budget;
        const auto t0 = std::chrono::steady_clock::now();
        std::unique_ptr<ParallelGroup> g = d.open_parallel(format, placement, n_max, n_ctx, f.seq_gpu_budget);
        f.open_s = ms_since(t0) / 1000;
        f.placement = g->placement();
        run.batch_limit = g->max_batch();
        bench_stage(fmt::format("{}: {} sequences of {} tokens opened in {:.1f} s, GPU budget {} each{}", where, n_max,
                                n_ctx, f.open_s, describe_bytes(f.seq_gpu_budget),
                                g->plan().empty() ? "" : "; " + g->plan()));
        // One token source per sequence: sequence s gets the same tokens whatever the other values of --parallel.
        std::vector<TokenSource> sources;
        for (int s = 0; s < n_max; ++s) sources.emplace_back(vocab, 42 + uint64_t(s));
        std::vector<int32_t> next(static_cast<size_t>(n_max));
        run.fills.push_back(fill_group(*g, depth, sources, next, f, where));
        std::vector<int> index(static_cast<size_t>(n_max));
        std::iota(index.begin(), index.end(), 0);
        BenchRow base;
        base.kind = "tg";
        base.n_tokens = a.n_gen;
        base.depth = depth;
        base.format = format;
        base.requested = placement;
        base.placement = f.placement;
        base.plan = g->plan();
        base.seq_gpu_budget = f.seq_gpu_budget;
        for (int n : ns) {
          run.rows.push_back(run_row(*g, n, a, d, base, next, index));
          const BenchRow& row = run.rows.back();
          step(*g, n, next, index, /*check=*/true, where, row.label());
          bench_stage(fmt::format("{}: {} {:.2f} t/s in all, {:.3f} ms per step ({} rounds), {:.2f}x its floor", where,
                                  row.label(), row.tps_mean(), row.ms_per_token(), row.rounds,
                                  row.ms_per_token() / row.floor_ms));
        }
      }
    }
  }
}

}  // namespace activekv::cli
