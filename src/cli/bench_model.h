// `activekv bench -m MODEL ...`: a whole model's prompt and decode speed in
// llama-bench's form (rows `pp512`, `tg128 @ d32768`; t/s mean ± stddev over
// repetitions; ms/token), beside the floor (the bytes a step must read over
// the bandwidth measured in the same run) and, for SPEC §1's 27B shape, the
// llama.cpp figure. Runs the real runtime: runtime::GpuRuntime on CUDA
// (bench_model_gpu.cpp), the CPU model path of `generate` on --device cpu
// (bench_model_cpu.cpp). Driver and flags: bench_model.cpp; the table, JSON
// and reference figures: bench_model_report.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "activekv/gguf/gguf.h"
#include "activekv/model/config.h"
#include "options.h"

namespace activekv::cli {

struct ModelBenchArgs {
  std::string model;
  std::vector<int> prompts{512};            ///< -p: prompt sizes (0: no pp rows)
  int n_gen = 128;                          ///< -n: tokens per decode row (0: no tg rows)
  std::vector<int64_t> depths{0};           ///< -d: history tokens before each row
  std::vector<std::string> formats{"bf16"}; ///< -ctk: bf16, lossless13, int8s, hybrid
  std::vector<std::string> placements{"auto"};  ///< --kv-placement: auto, host, gpu, partial (gpu/partial: CUDA only)
  int reps = 3;                             ///< -r
  std::string output = "md";                ///< -o: md | json (stdout)
  std::string device = "auto";              ///< auto | cuda | cpu
  std::string json_out;                     ///< --json FILE: the JSON, whatever -o says
  int threads = default_threads();          ///< CPU threads (--device cpu)
  int page_size = 1024;
  int recent_pages = 2;
  int tile_pages = 32;
  int convert_threads = 0;                  ///< 0: half the hardware threads, at least 1
  int prefill_chunk = 512;
  std::string cuda_graphs = "auto";         ///< --cuda-graphs auto|on|off: gpu-placement decode steps as CUDA graphs
  bool profile_timed = false;               ///< --profile-timed: cudaProfilerStart/Stop around the timed decode steps
  double cpu_share = kCpuShareUnset;        ///< --cpu-share: rows whose pages stream, co-attention (CUDA);
                                            ///< unset: resolve_cpu_share per placement
  double gpu_kv_mem_gib = 0;                ///< --gpu-kv-mem: the GPU budget for the history (0: free less a margin);
                                            ///< with --parallel, the budget all sequences share
  std::vector<int> parallel;                ///< --parallel: sequences decoding together, one row each (CUDA;
                                            ///< empty: single-history rows; bench_parallel.h)
  double seq_gpu_kv_mem_gib = 0;            ///< --seq-gpu-kv-mem: each sequence's GPU budget (0: --gpu-kv-mem / N)
  bool prompts_given = false;               ///< -p was on the command line (--parallel refuses it)
  std::vector<int> gpus;                    ///< --gpus: the model tensor parallel over these GPUs (CUDA, bf16;
                                            ///< empty: one GPU; runtime::TensorParallelRuntime)
};

/// Random token ids in [0, vocab), the same sequence for the same seed (the
/// histories the bench fills and the tokens it feeds are repeatable).
class TokenSource {
 public:
  explicit TokenSource(int vocab, uint64_t seed = 42) : rng_(seed), dist_(0, vocab - 1) {}
  std::vector<int32_t> next(int64_t n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (int32_t& t : v) t = dist_(rng_);
    return v;
  }

 private:
  std::mt19937_64 rng_;
  std::uniform_int_distribution<int32_t> dist_;
};

/// One progress line on stderr ("bench: <what>"), flushed.
void bench_stage(const std::string& what);

/// Throws Error if a logit is not finite: "bench: <where>: after <label>
/// logit i of n is x (not finite): ..." (a random model with bad scales, or
/// a kernel gone wrong, is not timed on).
void check_finite_logits(const std::vector<float>& logits, const std::string& where, const std::string& label);

/// One history on the device under test, sized for a row's tokens.
class ParallelGroup;  // bench_parallel.h

class BenchSession {
 public:
  virtual ~BenchSession() = default;
  virtual int64_t n_tokens() const = 0;
  /// Appends `tokens` through the prefill path; returns the token sampled after them.
  virtual int32_t prefill(std::span<const int32_t> tokens) = 0;
  /// One decode step: appends `token`, returns the token sampled after it.
  virtual int32_t decode(int32_t token) = 0;
  /// Blocks until background conversion has published every full page (steady state).
  virtual void wait_conversions() = 0;
  /// History bytes all decode steps so far moved over the floor's history
  /// path: GPU host placement, copied host -> device; GPU gpu placement, read
  /// in HBM; CPU, read from host memory.
  virtual double history_bytes() const = 0;
  /// The last step's logits, [vocab] (checked finite after every row: a
  /// random model with bad scales, or a kernel gone wrong, is not timed on).
  virtual std::vector<float> last_logits() const = 0;
  /// GPU partial placement: the history bytes all decode steps read in place
  /// on the GPU (history_bytes() then counts the streamed ones); else 0.
  virtual double resident_history_bytes() const { return 0; }
  /// The placement the session runs ("host", "gpu", "partial"; the CPU: "host").
  virtual std::string placement() const { return "host"; }
  /// One line: which plan the session chose and why (empty on the CPU).
  virtual std::string plan() const { return {}; }
  /// The host CPU's share of the streamed pages (co-attention; -1 auto; 0: none, and on the CPU).
  virtual double cpu_share() const { return 0; }
  /// --cpu-share auto on the GPU: the calibrated rates and the last step's
  /// plan with the feedback's correction (RuntimeStats::co_attention); empty elsewhere.
  virtual std::string co_attention() const { return {}; }
  /// GPU: host seconds all decode steps so far spent enqueuing their work
  /// (RuntimeStats::decode_enqueue_s); the CPU: 0 (nothing is enqueued).
  virtual double enqueue_seconds() const { return 0; }
};

/// The device under test: its bandwidths (measured in this run) and how to open a session.
struct BenchDevice {
  std::string name;
  double weight_bytes = 0;     ///< weight bytes one decode step reads (the head, every layer; one embedding row)
  double weight_gbps = 0;      ///< what they are read at: GPU HBM read; CPU host-memory read (GB/s = 1e9 B/s)
  std::string weight_link;     ///< "HBM read" | "host read"
  std::string weight_form;     ///< how the step reads them: "as stored in the GGUF" (GPU) | the CPU's (bench_model_cpu.cpp)
  double h2d_gbps = 0;         ///< GPU: pinned host -> device copies (0 on the CPU); --gpus: the distinct
                               ///< GPUs' links together (link_gbps summed; the floor is floor_ms's)
  /// --gpus: the tensor-parallel GPUs, each distinct GPU's measured link
  /// (GB/s, in order of first appearance) and how many distinct GPUs there are.
  std::vector<int> gpus;
  std::vector<double> link_gbps;
  int hbm_devices = 1;
  /// --gpus: a tg row's floor (ms per token) from its history and resident
  /// bytes per token, the slowest GPU's: its shards' weights from its HBM
  /// plus its heads' share of the history over its own link (resident: its
  /// HBM). Empty: the one-device formula (weight_bytes, history_gbps).
  std::function<double(const std::string& placement, double history_bytes, double resident_bytes,
                       double weights_gbps)>
      floor_ms;
  std::string depth_fill = "prefill";
  bool cuda_graphs = false;    ///< GPU decode steps with gpu placement ran as CUDA graphs (--cuda-graphs on)
  /// GB/s of the history path for a placement (host and partial -- its
  /// streamed pages --: H2D; gpu: HBM; cpu: host read).
  double history_gbps(const std::string& placement) const { return history_gbps(placement, weight_gbps); }
  /// As above, with the weights' link (and the CPU's history path) at
  /// `weights_gbps`: a tg row's probed bandwidth (probe_gbps).
  double history_gbps(const std::string& placement, double weights_gbps) const {
    return placement != "gpu" && h2d_gbps > 0 ? h2d_gbps : weights_gbps;
  }
  /// The CPU: a short host-read probe (GB/s, the working set weight_gbps was
  /// measured on) that run_tg calls right before and right after each
  /// repetition's timed steps; the row's floor takes the probes' mean, so
  /// that steps and bandwidth are timed under the same load (weight_gbps,
  /// measured once before the rows, could come from a quieter or a busier
  /// minute). Empty on the GPU: its floors use the bandwidths measured up front.
  std::function<double()> probe_gbps;
  /// What probe_gbps measures, for the report (empty without probes).
  std::string probe_note;
  std::function<std::unique_ptr<BenchSession>(const std::string& format, const std::string& placement, int64_t n_ctx)>
      open;
  /// --parallel (CUDA): n histories of n_ctx tokens against one model, each
  /// with a GPU budget of seq_budget bytes; empty elsewhere.
  std::function<std::unique_ptr<ParallelGroup>(const std::string& format, const std::string& placement, int n,
                                               int64_t n_ctx, uint64_t seq_budget)>
      open_parallel;
  uint64_t kv_budget = 0;      ///< --parallel: the GPU bytes the sequences' histories share (the model's budget)
  /// --profile-timed: called with true before a tg row's timed steps and
  /// false after them (cudaProfilerStart/Stop, so that `ncu
  /// --profile-from-start off` sees those kernels only); empty otherwise.
  std::function<void(bool)> timed_range;
  void mark_timed(bool on) const {
    if (timed_range) timed_range(on);
  }
};

/// Weight bytes one decode step reads: every tensor but the token embedding
/// (of which it reads one row), plus the embedding again when the head is
/// tied to it. `cpu`: counted as the CPU path holds them
/// (model::cpu_tensor_bytes), else in their GGUF types.
double decode_weight_bytes(const gguf::File& f, bool cpu);

/// The CPU device: LlamaModel (generate's CPU path) with `a.threads` threads;
/// measures the host read bandwidth.
BenchDevice cpu_bench_device(const ModelBenchArgs& a, const gguf::File& f);
#ifdef ACTIVEKV_HAVE_CUDA
/// The GPU device: runtime::GpuRuntime; measures HBM read and H2D bandwidth.
BenchDevice gpu_bench_device(const ModelBenchArgs& a, const gguf::File& f, const model::ModelConfig& c);
/// The options `generate --device cuda` would take for the bench's flags (greedy sampling).
struct GenerateArgs;
GenerateArgs bench_generate_args(const ModelBenchArgs& a);
#endif

/// One row: a test (ppN or tgN) at a depth, format and placement, all repetitions.
struct BenchRow {
  std::string kind;            ///< "pp" | "tg"
  int n_tokens = 0;            ///< tokens timed per repetition
  int64_t depth = 0;           ///< -d value
  std::string format, placement;
  double cpu_share = 0;        ///< host placement: share of the pages the host CPU attended (co-attention)
  std::vector<double> ms;      ///< per repetition: wall time of the n_tokens
  std::vector<int64_t> depth_start;  ///< per repetition: history tokens when it began
  double history_bytes_per_token = 0;  ///< tg: measured over the timed steps
  double resident_bytes_per_token = 0; ///< tg, partial placement: read in place on the GPU (HBM) per token
  std::string requested;       ///< --kv-placement as given (placement: what the session ran)
  std::string plan;            ///< the session's plan line (BenchSession::plan)
  std::string co_attention;    ///< tg with --cpu-share auto: the planner's rates and its plan after the timed steps
  double floor_ms = 0;         ///< tg: weight + history bytes over the measured bandwidths (0: none)
  double floor_gbps = 0;       ///< tg: the weights' link GB/s the floor used: the probes' mean, else weight_gbps
  std::vector<double> probe_gbps;  ///< tg with BenchDevice::probe_gbps: GB/s before and after each repetition, in order
  double enqueue_ms_per_token = 0;  ///< tg on the GPU: host time enqueuing a step (about ms/token: host-bound)
  // --parallel rows (bench_parallel.h): n_tokens steps, each advancing every
  // one of n_seqs sequences by a token; ms per repetition, history bytes per
  // token and the floor are per step (all sequences); depth_start is the
  // shortest sequence's.
  int n_seqs = 0;              ///< sequences decoding together (0: a single-history row)
  int rounds = 0;              ///< forward passes per step: ceil(n_seqs / the batch limit)
  double weight_floor_ms = 0, history_floor_ms = 0;  ///< the floor's two parts (floor_ms their sum)
  uint64_t seq_gpu_budget = 0; ///< each sequence's GPU budget, bytes
  std::vector<std::vector<int32_t>> seq_tokens;  ///< [sequence] the tokens the timed steps sampled, all repetitions

  std::string label() const;   ///< "pp512", "tg128 @ d32768"; --parallel: "tg32 @ d32768 x16"
  /// Tokens per second: all sequences' tokens (n_tokens x max(1, n_seqs)) over the wall time.
  double tps_mean() const;
  std::vector<double> reps_tps() const;  ///< per repetition, as tps_mean
  double tps_stddev() const;   ///< sample stddev over repetitions (0 for one)
  double ms_per_token() const; ///< mean over repetitions of ms / n_tokens (--parallel: ms per step)
};

/// llama.cpp's figure from SPEC §1 for a row (ms/token; the cache type it
/// was measured with), for the 27B shape only; ms < 0 when SPEC has none.
struct LlamaCppFigure {
  double ms = -1;
  std::string cache;
};
/// True for SPEC §1's 27B attention shape with Q4_0 matrices (the file llama.cpp was measured with).
bool is_27b_shape(const gguf::File& f, const model::ModelConfig& c);
LlamaCppFigure llama_cpp_figure(const BenchRow& r);

/// --parallel: how one group of sequences was filled (bench_parallel.h).
struct ParallelFill {
  std::string format, requested, placement;  ///< -ctk value, --kv-placement as given, the placement that ran
  int64_t depth = 0;           ///< -d value (a depth of 0 is filled with one token: decode needs a prefilled history)
  int64_t fill_tokens = 0;     ///< tokens each sequence was prefilled with
  double open_s = 0;           ///< opening the sequences (their pinned page stores, budgets, engines)
  std::vector<double> fill_s;  ///< [sequence] its prefill, one after another
  double conversion_s = 0;     ///< then, until background conversion had caught up in all
  uint64_t seq_gpu_budget = 0; ///< each sequence's GPU budget, bytes
};

/// Everything the report needs about the run.
struct BenchRun {
  std::string model_path;
  model::ModelConfig config;
  double params = 0, file_bytes = 0;
  bool shape_27b = false;
  const BenchDevice* device = nullptr;
  std::vector<BenchRow> rows;
  bool parallel = false;       ///< --parallel rows (bench_parallel.h), reported in their own table
  std::vector<ParallelFill> fills;
  int batch_limit = 0;         ///< --parallel: sequences one forward pass advances at most
};
/// The run's first line: model, device, depth fill, bandwidths measured.
std::string run_header_line(const BenchRun& run);
/// The llama-bench-like markdown table.
std::string markdown_table(const BenchRun& run);
/// The JSON document (command, commit, device, model shape, rows with every repetition).
std::string json_report(const BenchRun& run);

}  // namespace activekv::cli
