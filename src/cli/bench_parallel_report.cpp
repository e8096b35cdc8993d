// `activekv bench --parallel` (bench_parallel.h): its table and JSON. The
// run's header (model, device, bandwidths) is bench_model_report.cpp's.
#include <fmt/format.h>

#include <numeric>

#include "bench_parallel.h"
#include "memory.h"

namespace activekv::cli {

std::string parallel_markdown(const BenchRun& run) {
  std::string out =
      "| kv | placement | test | seqs | rounds | t/s (all) | t/s per seq | ms/step | floor ms | x floor |\n"
      "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  for (const BenchRow& r : run.rows) {
    const double ms = r.ms_per_token();
    out += fmt::format("| {} | {} | {} | {} | {} | {:.2f} ± {:.2f} | {:.2f} | {:.3f} | {:.3f} | {:.2f} |\n", r.format,
                       r.placement, r.label(), r.n_seqs, r.rounds, r.tps_mean(), r.tps_stddev(),
                       r.tps_mean() / r.n_seqs, ms, r.floor_ms, ms / r.floor_ms);
  }
  out += fmt::format(
      "\n- a step advances every sequence of the row by one token: GpuModel::decode_batch in rounds of at most {} "
      "sequences (one forward pass each, the weights read once per round); t/s (all) = sequences x tokens / wall\n"
      "- floor = weight bytes x rounds / HBM read + the step's history bytes (all sequences) / the history path "
      "(host: host->device, gpu: HBM read)\n",
      run.batch_limit);
  for (const ParallelFill& f : run.fills) {
    const double total = std::accumulate(f.fill_s.begin(), f.fill_s.end(), 0.0);
    out += fmt::format("- {} {} d{}: {} sequences ({}), GPU budget {} each, opened in {:.1f} s, filled by prefill of "
                       "{} random tokens each, one after another, in {:.1f} s ({:.0f} tokens/s), conversion caught up "
                       "{:.1f} s later; rows use the first N\n",
                       f.format, f.requested, f.depth, f.fill_s.size(), f.placement, describe_bytes(f.seq_gpu_budget),
                       f.open_s, f.fill_tokens, total, double(f.fill_tokens) * double(f.fill_s.size()) / total,
                       f.conversion_s);
  }
  std::string last;  // each group's plan line once
  for (const BenchRow& r : run.rows) {
    const std::string line = r.plan.empty() ? "" : fmt::format("- {} {} d{}: {}\n", r.format, r.requested, r.depth, r.plan);
    if (line != last) out += line;
    last = line;
  }
  return out;
}

void add_parallel_json(const BenchRun& run, nlohmann::json& j) {
  nlohmann::json rows = nlohmann::json::array();
  for (const BenchRow& r : run.rows) {
    const double ms = r.ms_per_token();
    rows.push_back({{"test", r.label()},
                    {"kind", r.kind},
                    {"n_seqs", r.n_seqs},
                    {"rounds", r.rounds},
                    {"n_steps", r.n_tokens},
                    {"depth", r.depth},
                    {"kv_format", r.format},
                    {"kv_placement", r.placement},
                    {"kv_placement_requested", r.requested},
                    {"plan", r.plan},
                    {"seq_gpu_kv_mem_bytes", r.seq_gpu_budget},
                    {"reps_ms", r.ms},
                    {"reps_tokens_per_s", r.reps_tps()},
                    {"reps_depth_start", r.depth_start},
                    {"tokens_per_s_mean", r.tps_mean()},
                    {"tokens_per_s_stddev", r.tps_stddev()},
                    {"tokens_per_s_per_seq", r.tps_mean() / r.n_seqs},
                    {"ms_per_step", ms},
                    {"history_bytes_per_step", r.history_bytes_per_token},
                    {"resident_bytes_per_step", r.resident_bytes_per_token},
                    {"floor_ms", r.floor_ms},
                    {"floor_weight_ms", r.weight_floor_ms},
                    {"floor_history_ms", r.history_floor_ms},
                    {"floor_ratio", ms / r.floor_ms},
                    {"seq_tokens", r.seq_tokens}});
  }
  nlohmann::json fills = nlohmann::json::array();
  for (const ParallelFill& f : run.fills)
    fills.push_back({{"kv_format", f.format},
                     {"kv_placement_requested", f.requested},
                     {"kv_placement", f.placement},
                     {"depth", f.depth},
                     {"n_seqs", f.fill_s.size()},
                     {"fill_tokens_per_seq", f.fill_tokens},
                     {"open_s", f.open_s},
                     {"fill_s", f.fill_s},
                     {"conversion_s", f.conversion_s},
                     {"seq_gpu_kv_mem_bytes", f.seq_gpu_budget}});
  j["parallel"] = true;
  j["batch_limit"] = run.batch_limit;
  j["kv_budget_bytes"] = run.device->kv_budget;
  j["depth_fill"] = "prefill, each sequence one after another (fills)";
  j["floor"] =
      "per step (every sequence of the row one token): weight_bytes_per_token x rounds / weights_gbps + "
      "history_bytes_per_step (all sequences) / (h2d_gbps for host placement, else weights_gbps) + "
      "resident_bytes_per_step / weights_gbps (partial placement)";
  j["fills"] = fills;
  j["rows"] = rows;
}

}  // namespace activekv::cli
