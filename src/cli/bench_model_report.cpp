// `activekv bench` (bench_model.h): row statistics, the llama.cpp reference
// figures of SPEC §1, the markdown table and the JSON document.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>

#include "bench_model.h"
#include "bench_parallel.h"
#include "provenance.h"

namespace activekv::cli {

std::string BenchRow::label() const {
  const std::string t = fmt::format("{}{}", kind, n_tokens);
  const std::string d = depth > 0 ? fmt::format("{} @ d{}", t, depth) : t;
  return n_seqs > 0 ? fmt::format("{} x{}", d, n_seqs) : d;  // llama-batched-bench's B as llama-bench's label
}

namespace {

std::vector<double> tps_of(const BenchRow& r) {
  const double tokens = double(r.n_tokens) * std::max(1, r.n_seqs);  // --parallel: every sequence's tokens
  std::vector<double> v;
  for (double ms : r.ms) v.push_back(ms > 0 ? 1000.0 * tokens / ms : 0.0);
  return v;
}

double mean(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
}

}  // namespace

double BenchRow::tps_mean() const { return mean(tps_of(*this)); }

std::vector<double> BenchRow::reps_tps() const { return tps_of(*this); }

double BenchRow::tps_stddev() const {
  const std::vector<double> v = tps_of(*this);
  if (v.size() < 2) return 0.0;
  const double m = mean(v);
  double ss = 0;
  for (double x : v) ss += (x - m) * (x - m);
  return std::sqrt(ss / double(v.size() - 1));
}

double BenchRow::ms_per_token() const {
  std::vector<double> v;
  for (double ms : ms) v.push_back(ms / n_tokens);
  return mean(v);
}

bool is_27b_shape(const gguf::File& f, const model::ModelConfig& c) {
  if (c.n_layers != 16 || c.d_model != 5120 || c.n_heads != 24 || c.n_kv_heads != 4 || c.head_dim != 256 ||
      c.ffn_dim != 17408 || c.vocab_size != 32000)
    return false;
  for (const gguf::TensorInfo& t : f.tensors())  // llama.cpp's file: every matrix Q4_0
    if (t.dims.size() == 2 && t.type != gguf::TensorType::Q4_0) return false;
  return true;
}

LlamaCppFigure llama_cpp_figure(const BenchRow& r) {
  // SPEC §1 (and issue 10's table): llama.cpp on the H200, a GGUF of the 27B
  // attention shape with random Q4_0 weights, ms/token of tg at that depth.
  // `host` = llama.cpp's -nkvo (the cache in host memory), `gpu` = resident.
  // Our bf16 is compared with its f16 cache, our 8-bit formats (int8s, and
  // hybrid, which reads int8s pages but the sink, recent window and tail) with
  // its q8_0 cache. f16 -nkvo at 128K timed out there: no figure.
  struct Ref {
    int64_t depth;
    const char* placement;
    const char* format;
    const char* cache;
    double ms;
  };
  static constexpr Ref kRefs[] = {
      {32768, "host", "bf16", "f16 -nkvo", 292.5},     {32768, "host", "int8s", "q8_0 -nkvo", 160.5},
      {32768, "host", "hybrid", "q8_0 -nkvo", 160.5},  {131072, "host", "int8s", "q8_0 -nkvo", 663.1},
      {131072, "host", "hybrid", "q8_0 -nkvo", 663.1}, {32768, "gpu", "bf16", "f16", 4.70},
      {131072, "gpu", "bf16", "f16", 5.26},
  };
  if (r.kind != "tg") return {};
  for (const Ref& x : kRefs)
    if (x.depth == r.depth && r.placement == x.placement && r.format == x.format) return {x.ms, x.cache};
  return {};
}

std::string run_header_line(const BenchRun& run) {
  const BenchDevice& d = *run.device;
  const bool any_depth = std::any_of(run.rows.begin(), run.rows.end(), [](const BenchRow& r) { return r.depth > 0; });
  const bool probed = d.probe_gbps && !run.parallel;  // tg floors then use their own probes, not this figure
  return fmt::format(
      "model: {} ({}), {} params, {:.3g} MB of tensors | device: {} | depth fill: {} | bandwidth measured{}: weights {:.1f} "
      "GB/s ({}){}\n\n",
      run.model_path, run.config.name.empty() ? run.config.arch : run.config.name,
      run.params >= 1e9 ? fmt::format("{:.2f}B", run.params / 1e9) : fmt::format("{:.2f}M", run.params / 1e6),
      run.file_bytes / 1e6, d.name, any_depth ? d.depth_fill : std::string("none (every row at depth 0)"),
      probed ? " at the start" : "", d.weight_gbps, d.weight_link,
      d.h2d_gbps > 0 ? fmt::format(", host->device {:.1f} GB/s", d.h2d_gbps) : std::string()) +
         (probed ? fmt::format("tg floors: {} (lines below the table).\n\n", d.probe_note) : std::string());
}

std::string markdown_table(const BenchRun& run) {
  std::string out = run_header_line(run);
  if (run.parallel) return out + parallel_markdown(run);
  out += "| kv | placement | test | t/s | ms/token | floor ms | x floor | llama.cpp ms | speed-up |\n";
  out += "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  for (const BenchRow& r : run.rows) {
    const LlamaCppFigure ref = run.shape_27b ? llama_cpp_figure(r) : LlamaCppFigure{};
    const double ms = r.ms_per_token();
    const std::string where = r.cpu_share > 0   ? fmt::format("{}+cpu{:.0f}%", r.placement, 100 * r.cpu_share)
                              : r.cpu_share < 0 ? r.placement + "+cpu-auto"
                                                : r.placement;
    // "± stddev" only over several repetitions (one has none to give).
    const std::string tps = r.reps_tps().size() > 1 ? fmt::format("{:.2f} ± {:.2f}", r.tps_mean(), r.tps_stddev())
                                                    : fmt::format("{:.2f}", r.tps_mean());
    out += fmt::format("| {} | {} | {} | {} | {:.3f} | {} | {} | {} | {} |\n", r.format, where, r.label(), tps, ms,
                       r.floor_ms > 0 ? fmt::format("{:.3f}", r.floor_ms) : "—",
                       r.floor_ms > 0 ? fmt::format("{:.2f}", ms / r.floor_ms) : "—",
                       ref.ms > 0 ? fmt::format("{:.2f} ({})", ref.ms, ref.cache) : "—",
                       ref.ms > 0 ? fmt::format("{:.2f}x", ref.ms / ms) : "—");
  }
  // A GPU step whose enqueue takes about its wall time is bound by the host, not the GPU.
  for (const BenchRow& r : run.rows)
    if (r.kind == "tg" && r.enqueue_ms_per_token > 0)
      out += fmt::format("- {} {} {}: the host spent {:.3f} of {:.3f} ms per token enqueuing the step\n", r.format,
                         r.placement, r.label(), r.enqueue_ms_per_token, r.ms_per_token());
  // The bandwidth each probed floor used (CPU tg rows: BenchDevice::probe_gbps).
  for (const BenchRow& r : run.rows)
    if (!r.probe_gbps.empty())
      out += fmt::format("- {} {} {}: floor at {:.1f} GB/s {}, the mean of {} probes around the timed steps "
                         "({:.1f}-{:.1f})\n",
                         r.format, r.placement, r.label(), r.floor_gbps, run.device->weight_link, r.probe_gbps.size(),
                         *std::min_element(r.probe_gbps.begin(), r.probe_gbps.end()),
                         *std::max_element(r.probe_gbps.begin(), r.probe_gbps.end()));
  // Which plan each history ran and why (GPU sessions; once per format, placement and depth).
  std::string last;
  for (const BenchRow& r : run.rows) {
    if (r.plan.empty()) continue;
    const std::string line = fmt::format("- {} {} d{}: {}\n", r.format, r.requested, r.depth, r.plan);
    if (line != last) out += line;
    last = line;
  }
  return out;
}

namespace {

nlohmann::json single_rows(const BenchRun& run) {
  nlohmann::json rows = nlohmann::json::array();
  for (const BenchRow& r : run.rows) {
    const LlamaCppFigure ref = run.shape_27b ? llama_cpp_figure(r) : LlamaCppFigure{};
    const double ms = r.ms_per_token();
    auto opt = [](bool has, double v) { return has ? nlohmann::json(v) : nlohmann::json(nullptr); };
    rows.push_back({{"test", r.label()},
                    {"kind", r.kind},
                    {"n_tokens", r.n_tokens},
                    {"depth", r.depth},
                    {"kv_format", r.format},
                    {"kv_placement", r.placement},
                    {"kv_placement_requested", r.requested},
                    {"plan", r.plan},
                    {"resident_bytes_per_token", opt(r.kind == "tg" && r.placement == "partial", r.resident_bytes_per_token)},
                    {"cpu_share", r.cpu_share < 0 ? nlohmann::json("auto") : nlohmann::json(r.cpu_share)},
                    {"co_attention", r.co_attention.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.co_attention)},
                    {"reps_ms", r.ms},
                    {"reps_tokens_per_s", tps_of(r)},
                    {"reps_depth_start", r.depth_start},
                    {"tokens_per_s_mean", r.tps_mean()},
                    {"tokens_per_s_stddev", r.tps_stddev()},
                    {"ms_per_token", ms},
                    {"history_bytes_per_token", opt(r.kind == "tg", r.history_bytes_per_token)},
                    {"floor_ms", opt(r.floor_ms > 0, r.floor_ms)},
                    {"floor_ratio", opt(r.floor_ms > 0, ms / r.floor_ms)},
                    {"floor_weights_gbps", opt(r.floor_ms > 0, r.floor_gbps)},
                    {"bandwidth_probes_gbps", r.probe_gbps.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.probe_gbps)},
                    {"host_enqueue_ms_per_token", opt(r.kind == "tg" && r.enqueue_ms_per_token > 0, r.enqueue_ms_per_token)},
                    {"llama_cpp_ms", opt(ref.ms > 0, ref.ms)},
                    {"llama_cpp_cache", ref.cache.empty() ? nlohmann::json(nullptr) : nlohmann::json(ref.cache)},
                    {"speedup_vs_llama_cpp", opt(ref.ms > 0, ref.ms / ms)}});
  }
  return rows;
}

}  // namespace

std::string json_report(const BenchRun& run) {
  const BenchDevice& d = *run.device;
  const model::ModelConfig& c = run.config;
  nlohmann::json j = {
      {"bench", "model"},
      {"command", command_line()},
      {"commit", git_commit()},
      {"environment", activekv_environment()},
      {"device", d.name},
      {"depth_fill", d.depth_fill},
      {"cuda_graphs", d.cuda_graphs},
      {"bandwidth", {{"weights_gbps", d.weight_gbps}, {"weights_link", d.weight_link},
                     {"h2d_gbps", d.h2d_gbps > 0 ? nlohmann::json(d.h2d_gbps) : nlohmann::json(nullptr)},
                     {"probes", d.probe_note.empty() ? nlohmann::json(nullptr) : nlohmann::json(d.probe_note)}}},
      {"weight_bytes_per_token", d.weight_bytes},
      {"model", {{"path", run.model_path}, {"name", c.name}, {"arch", c.arch}, {"n_layers", c.n_layers},
                 {"d_model", c.d_model}, {"n_heads", c.n_heads}, {"n_kv_heads", c.n_kv_heads},
                 {"head_dim", c.head_dim}, {"ffn_dim", c.ffn_dim}, {"vocab", c.vocab_size},
                 {"params", run.params}, {"file_bytes", run.file_bytes}, {"shape_27b", run.shape_27b}}},
      {"floor", "tg rows: weight_bytes_per_token / weights_gbps + history_bytes_per_token / (h2d_gbps for host "
                "placement on the GPU, else weights_gbps) + resident_bytes_per_token / weights_gbps (partial "
                "placement); pp rows: none. Rows with cpu_share > 0 (co-attention) "
                "count only the streamed history bytes: the link's floor, not the floor of link and CPU together. "
                "weights_gbps there is the row's floor_weights_gbps: the mean of its bandwidth_probes_gbps (taken "
                "before and after each repetition's timed steps, in that order; bandwidth.probes says how) where the "
                "device probes (the CPU), else bandwidth.weights_gbps (measured once, before the rows)"},
      {"llama_cpp", "SPEC §1 figures (H200, random-Q4_0 GGUF of the 27B attention shape), only for that shape"}};
  if (!d.gpus.empty())
    j["tensor_parallel"] = {{"gpus", d.gpus}, {"link_gbps_per_distinct_gpu", d.link_gbps},
                            {"distinct_gpus", d.hbm_devices},
                            {"floor", "tg rows: the slowest GPU's: its shards' decode reads / weights_gbps + its "
                                      "heads' share of history_bytes_per_token / its link (gpu placement: / "
                                      "weights_gbps) + that share of resident_bytes_per_token / weights_gbps. "
                                      "weight_bytes_per_token is the largest GPU's read; weights_gbps GPU 0's HBM "
                                      "for every GPU; the links were measured one at a time (not together); the "
                                      "all-reduces' latency is not in the floor"}};
  if (run.parallel) add_parallel_json(run, j);  // its own rows, floor and fills
  else j["rows"] = single_rows(run);
  return j.dump(2) + "\n";
}

}  // namespace activekv::cli
