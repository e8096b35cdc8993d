// `activekv bench -m MODEL ...` (bench_model.h): flags, checks and the
// driver. Per kv format, placement and depth: one fresh history (a session)
// sized for the row's tokens; the depth filled by prefill of random tokens
// (untimed); then the tg rows (after background conversion has caught up
// and one untimed warm-up step -- two with --cuda-graphs on --, n timed
// decode steps, token out of each; on the CPU between two untimed host-read
// bandwidth probes, which price the row's floor) and
// the pp rows (one timed prefill of p tokens each), every repetition on the
// same history, which grows by what the previous one appended (recorded per
// repetition as depth_start).
#include "bench_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <set>
#include <utility>

#include "activekv/core/error.h"
#include "activekv/core/text_file.h"
#ifdef ACTIVEKV_HAVE_CUDA
#include "activekv/cuda/decode_attention.h"
#endif
#include "activekv/model/weights.h"
#include "bench_parallel.h"
#include "commands.h"
#include "generate.h"
#include "memory.h"
#include "options.h"
#include "stats.h"

namespace activekv::cli {

double decode_weight_bytes(const gguf::File& f, bool cpu) {
  const bool tied = f.find_tensor("output.weight") == nullptr;
  const model::WeightFormat format = cpu ? model::weight_format_from_env() : model::WeightFormat::automatic;
  double bytes = 0;
  for (const gguf::TensorInfo& t : f.tensors()) {
    const double b = cpu ? double(model::cpu_tensor_bytes(t, format)) : double(t.n_bytes);
    if (t.name != "token_embd.weight") bytes += b;
    else bytes += (tied ? b : 0.0) + b / double(t.dims.size() == 2 ? t.dims[1] : 1);  // the head, one row
  }
  return bytes;
}

namespace {

const std::set<std::string> kFormats{"bf16", "lossless13", "int8s", "hybrid"};

// One line per bad value, before the model loads.
void check_args(const ModelBenchArgs& a, const std::string& device) {
  if (a.prompts.empty() || a.depths.empty() || a.formats.empty() || a.placements.empty())
    throw Error("bench: -p, -d, -ctk and --kv-placement need at least one value each");
  if (a.n_gen == 0 && std::all_of(a.prompts.begin(), a.prompts.end(), [](int p) { return p == 0; }))
    throw Error("bench: nothing to run (-n 0 and every -p 0)");
  for (int64_t d : a.depths)
    if (d < 0 || d > kMaxTokens) throw Error(fmt::format("bench: -d {}: a depth is in [0, {}]", d, kMaxTokens));
  for (const std::string& f : a.formats) {
    if (f == "f16")
      throw Error("bench: -ctk f16 is llama.cpp's name; ActiveKV's exact 16-bit history is bf16 (-ctk bf16)");
    if (!kFormats.count(f)) throw Error(fmt::format("bench: -ctk {}: unknown kv format (bf16, lossless13, int8s, hybrid)", f));
  }
  for (const std::string& p : a.placements) {
    if (p != "host" && p != "gpu" && p != "partial" && p != "auto")
      throw Error(fmt::format("bench: --kv-placement {}: auto, host, gpu or partial", p));
    if ((p == "gpu" || p == "partial") && device == "cpu")
      throw Error(fmt::format("bench: --kv-placement {} needs --device cuda (the CPU path reads the history in host "
                              "memory)", p));
  }
  if (a.cuda_graphs == "on" && device == "cpu")
    throw Error("bench: --cuda-graphs applies to --device cuda only");
  if (a.cpu_share != kCpuShareUnset && device == "cpu")
    throw Error("bench: --cpu-share applies to --device cuda only (the CPU path attends every page on the CPU)");
  if (a.gpu_kv_mem_gib != 0 && device == "cpu") throw Error("bench: --gpu-kv-mem applies to --device cuda only");
  if (a.profile_timed && device == "cpu") throw Error("bench: --profile-timed applies to --device cuda only");
  if (!(a.gpu_kv_mem_gib >= 0)) throw Error(fmt::format("bench: --gpu-kv-mem {}: GiB >= 0", a.gpu_kv_mem_gib));
  if (a.output != "md" && a.output != "json") throw Error(fmt::format("bench: -o {}: md or json", a.output));
  // -t, --page-size, --tile-pages, --prefill-chunk, --recent-pages and
  // --convert-threads are ranged where they are declared (add_bench).
  if (!a.gpus.empty()) {
    if (device != "cuda")
      throw Error(a.device == "auto" ? "bench: --gpus needs a GPU, and none is usable here (--device auto chose the CPU)"
                                     : "bench: --gpus needs --device cuda");
    if (!a.parallel.empty()) throw Error("bench: --gpus does not run --parallel rows yet");
    if (a.cpu_share != kCpuShareUnset && a.cpu_share != 0)
      throw Error("bench: --gpus cannot give pages to the CPU (--cpu-share) yet");
    if (a.cuda_graphs == "on") throw Error("bench: --gpus runs kernel by kernel: leave out --cuda-graphs on");
    for (int g : a.gpus)
      if (g < 0) throw Error(fmt::format("bench: --gpus: device {} is negative", g));
  }
  if (!a.json_out.empty()) {
    check_writable(a.json_out, "bench --json output");
    check_not_an_input(a.json_out, {a.model.empty() ? default_model_path() : a.model}, "bench --json output");
  }
}

// Appends random tokens until the history holds `depth` (untimed), then waits for conversion.
void fill_depth(BenchSession& s, int64_t depth, TokenSource& tokens, const std::string& where, bool compressed) {
  if (s.n_tokens() >= depth) return;
  const int64_t n = depth - s.n_tokens();
  bench_stage(fmt::format("{}: depth fill by prefill of {} random tokens", where, n));
  const auto t0 = std::chrono::steady_clock::now();
  s.prefill(tokens.next(n));
  const double fill_ms = ms_since(t0);
  const auto t1 = std::chrono::steady_clock::now();
  s.wait_conversions();
  const std::string conversion =
      compressed ? fmt::format("; conversion caught up {:.1f} s later", ms_since(t1) / 1000) : std::string();
  bench_stage(fmt::format("{}: filled in {:.1f} s ({:.0f} tokens/s){}", where, fill_ms / 1000,
                          1000.0 * double(n) / fill_ms, conversion));
}

// The bandwidth probe around a repetition's timed steps (BenchDevice::probe_gbps; none on the GPU).
void probe(const BenchDevice& dev, BenchRow& row) {
  if (dev.probe_gbps) row.probe_gbps.push_back(dev.probe_gbps());
}

// n decode steps per repetition, each after conversion caught up and one
// warm-up step; on the CPU between two bandwidth probes, untimed.
BenchRow run_tg(BenchSession& s, const ModelBenchArgs& a, const BenchDevice& dev, BenchRow row, TokenSource& tokens) {
  double bytes = 0, resident = 0, enqueue_s = 0;
  for (int r = 0; r < a.reps; ++r) {
    s.wait_conversions();
    // The warm-up step (an empty history's first token goes through prefill,
    // as generate's prompt does): device uploads of newly published pages
    // and first-touch costs land here, not in the timed steps.
    int32_t next = s.n_tokens() == 0 ? s.prefill(tokens.next(1)) : s.decode(tokens.next(1)[0]);
    // With CUDA graphs a runtime's first decode step runs eagerly and the
    // next instantiates the step's graph (once per session): untimed too.
    if (dev.cuda_graphs) next = s.decode(next);
    row.depth_start.push_back(s.n_tokens());
    const double b0 = s.history_bytes(), r0 = s.resident_history_bytes(), e0 = s.enqueue_seconds();
    probe(dev, row);
    dev.mark_timed(true);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < row.n_tokens; ++i) next = s.decode(next);
    row.ms.push_back(ms_since(t0));
    dev.mark_timed(false);
    probe(dev, row);
    bytes += s.history_bytes() - b0;
    resident += s.resident_history_bytes() - r0;
    enqueue_s += s.enqueue_seconds() - e0;
  }
  row.enqueue_ms_per_token = 1e3 * enqueue_s / double(a.reps) / row.n_tokens;
  row.co_attention = s.co_attention();
  row.history_bytes_per_token = bytes / double(a.reps) / row.n_tokens;
  row.resident_bytes_per_token = resident / double(a.reps) / row.n_tokens;
  // The weights' link at the probes' mean where the device probes (the CPU:
  // the history's too), else at what was measured before the rows.
  row.floor_gbps = row.probe_gbps.empty() ? dev.weight_gbps
                                          : std::accumulate(row.probe_gbps.begin(), row.probe_gbps.end(), 0.0) /
                                                double(row.probe_gbps.size());
  // partial: the streamed bytes over the link (history_gbps of a placement other than gpu) plus the resident ones in HBM.
  row.floor_ms = dev.floor_ms
                     ? dev.floor_ms(row.placement, row.history_bytes_per_token, row.resident_bytes_per_token,
                                    row.floor_gbps)
                     : dev.weight_bytes / (row.floor_gbps * 1e6) +
                           row.history_bytes_per_token / (dev.history_gbps(row.placement, row.floor_gbps) * 1e6) +
                           row.resident_bytes_per_token / (row.floor_gbps * 1e6);
  return row;
}

// One timed prefill of n_tokens per repetition.
BenchRow run_pp(BenchSession& s, const ModelBenchArgs& a, BenchRow row, TokenSource& tokens) {
  for (int r = 0; r < a.reps; ++r) {
    s.wait_conversions();
    const std::vector<int32_t> prompt = tokens.next(row.n_tokens);
    row.depth_start.push_back(s.n_tokens());
    const auto t0 = std::chrono::steady_clock::now();
    s.prefill(prompt);
    row.ms.push_back(ms_since(t0));
  }
  return row;
}

// After a row (untimed): the last logits must be finite.
void check_finite(const BenchSession& s, const BenchRow& row, const std::string& where) {
  check_finite_logits(s.last_logits(), where, row.label());
}

void run_rows(const ModelBenchArgs& a, const BenchDevice& dev, int vocab, std::vector<BenchRow>& rows) {
  TokenSource tokens(vocab);
  const int64_t pp_tokens = std::accumulate(a.prompts.begin(), a.prompts.end(), int64_t(0));
  const int64_t warmups = dev.cuda_graphs ? 2 : 1;  // untimed steps before each tg repetition (run_tg)
  const int64_t row_tokens = int64_t(a.reps) * (pp_tokens + a.n_gen + warmups) + 1;
  for (const std::string& format : a.formats) {
    for (const std::string& placement : a.placements) {
      for (int64_t depth : a.depths) {
        std::unique_ptr<BenchSession> s = dev.open(format, placement, depth + row_tokens);
        // The placement the session took, as the table shows it ("host (asked auto)").
        const std::string where =
            fmt::format("{} {} d{}", format,
                        s->placement() == placement ? placement : fmt::format("{} (asked {})", s->placement(), placement),
                        depth);
        if (!s->plan().empty()) bench_stage(fmt::format("{}: {}", where, s->plan()));
        fill_depth(*s, depth, tokens, where, format != "bf16");
        BenchRow base;
        base.depth = depth;
        base.format = format;
        base.requested = placement;
        base.placement = s->placement();
        base.plan = s->plan();
        base.cpu_share = s->cpu_share();  // -1: auto
        if (a.n_gen > 0) {
          BenchRow row = base;
          row.kind = "tg";
          row.n_tokens = a.n_gen;
          rows.push_back(run_tg(*s, a, dev, row, tokens));
          check_finite(*s, rows.back(), where);
          bench_stage(fmt::format("{}: {} {:.2f} t/s", where, rows.back().label(), rows.back().tps_mean()));
          if (!rows.back().co_attention.empty()) bench_stage(fmt::format("{}: co-attention {}", where, rows.back().co_attention));
        }
        for (int p : a.prompts) {
          if (p == 0) continue;
          BenchRow row = base;
          row.kind = "pp";
          row.n_tokens = p;
          rows.push_back(run_pp(*s, a, row, tokens));
          check_finite(*s, rows.back(), where);
          bench_stage(fmt::format("{}: {} {:.2f} t/s", where, rows.back().label(), rows.back().tps_mean()));
        }
      }
    }
  }
}

int run_model_bench(ModelBenchArgs a) {
  const std::string device = resolve_device(a.device);
  check_args(a, device);
  check_parallel_args(a, device);
  if (a.convert_threads == 0) a.convert_threads = std::max(1, default_threads() / 2);
  BenchRun run;
  run.model_path = a.model.empty() ? default_model_path() : a.model;
  a.model = run.model_path;
  const gguf::File file = gguf::File::open(run.model_path);
  run.config = model::ModelConfig::from_gguf(file);
  for (const gguf::TensorInfo& t : file.tensors()) {
    run.params += double(t.n_elements);
    run.file_bytes += double(t.n_bytes);
  }
  run.shape_27b = is_27b_shape(file, run.config);
  if (!a.parallel.empty()) require_parallel_host_fits(a, run.config, available_memory_bytes());
#ifdef ACTIVEKV_HAVE_CUDA
  // After every check of the arguments, before the first progress line: one line without a GPU.
  // It leaves the home GPU (--gpus' first) current: the device name and the
  // HBM and link figures up front are that GPU's.
  if (device == "cuda") cuda::require_gpu(a.gpus.empty() ? 0 : a.gpus[0], "bench --device cuda");
#endif
  // Speed is measured past the trained context too (random tokens: no quality is claimed), but say so.
  const int64_t deepest = *std::max_element(a.depths.begin(), a.depths.end());
  if (run.config.context_length > 0 && deepest > run.config.context_length)
    bench_stage(fmt::format("note: depth {} is past the model's trained context ({} tokens); the rows there measure "
                            "speed only",
                            deepest, run.config.context_length));
  bench_stage(run.shape_27b ? "the model is SPEC §1's 27B attention shape with Q4_0 matrices: llama.cpp's figures shown"
                      : "not SPEC §1's 27B shape (or not Q4_0): no llama.cpp figures");
  bench_stage(fmt::format("measuring bandwidths and loading {} on {}", run.model_path, device));
#ifdef ACTIVEKV_HAVE_CUDA
  BenchDevice dev = device == "cuda" ? gpu_bench_device(a, file, run.config) : cpu_bench_device(a, file);
  if (!a.parallel.empty()) add_gpu_parallel(dev, a, file, run.config);  // check_parallel_args: cuda only
#else
  const BenchDevice dev = cpu_bench_device(a, file);
#endif
  run.device = &dev;
  bench_stage(fmt::format("{}: weights {:.1f} GB/s ({}){}; {:.1f} MiB of weights ({}) read per decode step", dev.name,
                    dev.weight_gbps, dev.weight_link,
                    dev.h2d_gbps > 0 ? fmt::format(", host->device {:.1f} GB/s", dev.h2d_gbps) : std::string(),
                    dev.weight_bytes / double(1 << 20), dev.weight_form));
  if (a.parallel.empty()) run_rows(a, dev, run.config.vocab_size, run.rows);
  else run_parallel_rows(a, dev, run.config, run);
  const std::string json = json_report(run);
  if (!a.json_out.empty()) {
    write_text_file(a.json_out, json, "bench --json output");
    bench_stage("wrote " + a.json_out);
  }
  fmt::print("{}", a.output == "json" ? json : markdown_table(run));
  std::fflush(stdout);
  return 0;
}

}  // namespace

void add_bench(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<ModelBenchArgs>();
  app.add_option("-m,--model", a->model, "GGUF model (default: $ACTIVEKV_MODEL, else the installed SmolLM2)")
      ->check(non_empty());
  CLI::Option* prompts =
      app.add_option("-p,--n-prompt", a->prompts, "Prompt sizes: pp rows (0: none)")->delimiter(',')->capture_default_str()
          ->check(count_range(0));
  app.add_option("-n,--n-gen", a->n_gen, "Tokens per decode (tg) row (0: none)")->capture_default_str()
      ->check(count_range(0));
  app.add_option("-d,--n-depth", a->depths, "History depths before each row, e.g. 0,32k,128k (k = 1024)")
      ->delimiter(',')->transform(token_count())->capture_default_str();
  app.add_option("--cache-type-k", a->formats, "KV formats (-ctk): bf16, lossless13, int8s, hybrid")
      ->delimiter(',')->capture_default_str();
  app.add_option("--kv-placement", a->placements,
                 "auto (gpu if the history fits --gpu-kv-mem, else partial), host (streamed from pinned host memory), "
                 "gpu (resident), partial (the hot pages resident within --gpu-kv-mem, the rest streamed); gpu and "
                 "partial: CUDA only (the CPU runs auto as host)")
      ->delimiter(',')->capture_default_str();
  app.add_option("--gpu-kv-mem", a->gpu_kv_mem_gib,
                 "CUDA: GiB the history's device pages may use (0: free memory after weights less a margin)")
      ->capture_default_str();
  app.add_option("-r,--repetitions", a->reps, "Repetitions per row (t/s mean ± stddev)")->capture_default_str()
      ->check(count_range(1));
  app.add_option("-o,--output", a->output, "md (markdown table) or json, on stdout")->capture_default_str();
  app.add_option("--device", a->device, "auto, cuda (runtime::GpuRuntime) or cpu (generate's CPU path)")
      ->capture_default_str()->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--json", a->json_out, "Also write the JSON to this file")->check(non_empty());
  app.add_option("-t,--threads", a->threads, "CPU threads (--device cpu)")->capture_default_str()
      ->check(in_range(1, 1024));
  app.add_option("--page-size", a->page_size, "Tokens per KV page")->capture_default_str()->check(in_range(1, 1 << 20));
  app.add_option("--recent-pages", a->recent_pages, "hybrid: full pages before the tail kept exact")->capture_default_str()
      ->check(in_range(0, 1 << 20));
  app.add_option("--tile-pages", a->tile_pages, "Pages per attention tile / streamed copy")->capture_default_str()
      ->check(in_range(1, 1 << 20));
  app.add_option("--convert-threads", a->convert_threads, "Background conversion threads (0: half the hardware's)")
      ->capture_default_str()->check(in_range(0, 256));
  app.add_option("--prefill-chunk", a->prefill_chunk, "Tokens per prefill forward pass")->capture_default_str()
      ->check(in_range(1, 1 << 16));
  app.add_option("--parallel", a->parallel,
                 "CUDA: sequences decoding together on one model (list, e.g. 1,8,16): one tg row per value, "
                 "`tgN @ dD xP`, every step advancing each sequence one token through GpuModel::decode_batch in rounds "
                 "of at most 8; decode rows only (no -p)")
      ->delimiter(',');
  app.add_option("--seq-gpu-kv-mem", a->seq_gpu_kv_mem_gib,
                 "--parallel: GiB of GPU budget each sequence gets (0: --gpu-kv-mem, or the free memory, / max N)")
      ->capture_default_str();
  app.add_option("--gpus", a->gpus,
                 "CUDA: the model tensor parallel over these GPUs (e.g. 0,1; 0,0: two shards on GPU 0), each "
                 "streaming its heads' history over its own link; no --cpu-share, --parallel or --cuda-graphs on")
      ->delimiter(',');
  add_cuda_graphs_option(app, a->cuda_graphs);
  add_cpu_share_option(app, a->cpu_share);
  app.add_flag("--profile-timed", a->profile_timed,
               "CUDA: only the timed decode steps between cudaProfilerStart and cudaProfilerStop (for ncu "
               "--profile-from-start off)");
  run = [a, prompts] {
    a->prompts_given = prompts->count() > 0;
    return run_model_bench(*a);
  };
}

}  // namespace activekv::cli
