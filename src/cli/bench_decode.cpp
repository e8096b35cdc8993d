// `activekv bench decode`: the GPU decode benchmark (SPEC §1 27B attention
// shape; every kv-format, streamed and resident). Code: bench/gpu.
#include "commands.h"
#include "gpu_bench.h"
#include "options.h"
#include "provenance.h"

namespace activekv::cli {

void add_bench_decode(CLI::App& app, std::function<int()>& run) {
  CLI::App* dec = &app;
  auto o = std::make_shared<gpu_bench::BenchDecodeOptions>();
  dec->add_option("--contexts,-d", o->contexts, "Depths (context tokens), e.g. 32k,64k,128k (k = 1024)")
      ->delimiter(',')
      ->transform(token_count())
      ->capture_default_str();
  dec->add_option("--batches,-b", o->batches, "Batch sizes")->delimiter(',')->capture_default_str();
  dec->add_option("--steps", o->steps, "Measured steps per configuration (median reported)")->capture_default_str();
  dec->add_option("--warmup", o->warmup, "Warm-up steps")->capture_default_str();
  dec->add_option("--layers", o->n_layers, "Attention layers per step")->capture_default_str();
  dec->add_option("--tile-pages", o->tile_pages, "Pages per staging tile (0 = whole layer)")->capture_default_str();
  dec->add_option("--ring", o->ring_slots, "Staging ring slots")->capture_default_str();
  dec->add_option("--split", o->attn.split_tokens, "Tokens per attention CTA (divides the page size)")->capture_default_str();
  dec->add_option("--modes", o->modes, "streamed, streamed-whole, resident")->delimiter(',')->capture_default_str();
  dec->add_option("--kv-format", o->formats, "Routes over the history: bf16, lossless13, int8s, hybrid")
      ->delimiter(',')->capture_default_str();
  dec->add_option("--cpu-share", o->cpu_shares,
                  "Co-attention: fractions of each layer's pages the host CPU attends (oldest first), or auto "
                  "(the planner's choice from rates measured in this run), e.g. 0,0.25,0.4,auto")
      ->delimiter(',')
      ->transform([](std::string v) { return v == "auto" ? std::string("-1") : v; }, "", "auto")
      ->capture_default_str();
  dec->add_option("--cpu-threads", o->cpu_threads, "CPU attention threads (0 = hardware - 1)")->capture_default_str();
  dec->add_option("--cpu-feedback-rounds", o->cpu_feedback_rounds,
                  "auto: rounds of steps that correct the CPU rates from measured steps before the timed ones, as "
                  "the runtime does (0 = the calibration's plan alone)")
      ->check(CLI::Range(0, 100))
      ->capture_default_str();
  dec->add_option("--recent-pages", o->recent_pages, "hybrid: full pages kept exact before the tail")->capture_default_str();
  dec->add_option("--query-terms", o->int8s.query_terms, "int8s kernel: int8 terms of the query (1 = SPEC as written)")->capture_default_str();
  dec->add_flag("!--no-skip-unit-rescale", o->int8s.skip_unit_rescale,
                "int8s kernel: always rescale (SPEC §4 trick 1 off)");
  dec->add_flag("!--no-tensor-cores", o->int8s.tensor_cores,
                "legacy int8s kernel: q.k with __dp4a instead of int8 mma");
  auto kernel_name = std::make_shared<std::string>(cuda::int8s_kernel_name(o->int8s.kernel));
  dec->add_option("--int8s-kernel", *kernel_name,
                  "int8s kernel: tc (per-warp rings, q.k and P.V on tensor cores; group 3, 4, 6, 7, 8), legacy, or "
                  "auto (tc where the shape allows)")
      ->capture_default_str()->check(CLI::IsMember({"tc", "legacy", "auto"}));
  auto tc_configs = std::make_shared<std::vector<std::string>>();
  dec->add_option("--int8s-tc-config", *tc_configs,
                  "tc int8s kernel launch configurations to sweep, w<warps>s<stages>[b<blocks per stage>] (e.g. "
                  "w2s3,w4s2,w2s2b2; default: ACTIVEKV_INT8S_TC_CONFIG, else w4s2cv for head_dim 256, w4s4 for 64)")
      ->delimiter(',');
  dec->add_flag("!--serial-formats", o->overlap_formats,
                "hybrid: run a job's bf16 and int8s kernels one after the other on the compute stream (default: "
                "the bf16 kernel overlapped on a side stream)");
  dec->add_flag("--pow2-reference", o->int8s.pow2_reference,
                "int8s kernel: integer base-2 running reference (SPEC §4 trick 2)");
  dec->add_option("--gpus", o->gpus,
                  "Split the step by KV head over these GPUs, one shard each, e.g. 0,1 (two links) or 0,0 (two "
                  "shards sharing GPU 0's link); default: GPU 0 alone, unsharded")
      ->delimiter(',');
  dec->add_flag("--copy-2d", o->copy_2d,
                "Head shards: copy a run of pages' K (or V) ranges as one cudaMemcpy2DAsync instead of one copy "
                "per range");
  dec->add_option("--json", o->json_path, "JSON output")->check(non_empty());
  dec->add_option("--profile", o->profile_path, "Calibration profile output");
  dec->add_option("--commit", o->provenance.commit,
                  "Commit recorded in the JSON (default: the source tree's, `git rev-parse HEAD`)");
  run = [o, kernel_name, tc_configs] {
    o->int8s.kernel = cuda::parse_int8s_kernel(*kernel_name);
    for (const std::string& c : *tc_configs) o->tc_configs.push_back(cuda::parse_int8s_tc_config(c));
    if (!o->tc_configs.empty()) o->int8s.tc = o->tc_configs.front();
    if (o->provenance.commit.empty()) o->provenance.commit = git_commit();
    o->provenance.command = command_line();
    o->provenance.environment = activekv_environment();
    return gpu_bench::run_bench_decode(*o);
  };
}

}  // namespace activekv::cli
