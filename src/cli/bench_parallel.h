// `activekv bench --parallel 1,8,16` (issue 16's figures): N histories
// decoding together on ONE model. Per kv format, placement and depth the
// bench opens max(N) sequences against the model (each with a GPU budget of
// --gpu-kv-mem / max(N), or --seq-gpu-kv-mem), fills them one after another
// by prefill of random tokens (untimed, timed apart and reported), then for
// each N in ascending order times steps over the first N sequences: a step
// advances every one of them by one token, through GpuModel::decode_batch in
// rounds of at most its batch limit (8: one forward pass per round, the
// weights read once per round). Rows `tg32 @ d32768 x16`: aggregate t/s
// (N x tokens / wall), ms per step, and the step's floor: the history bytes
// the step moved (all N sequences) over the history path's measured
// bandwidth (host placement: H2D; gpu: HBM) plus the weight bytes x rounds
// over the measured HBM bandwidth.
//
// The driver runs against ParallelGroup, so that its arithmetic (rounds,
// floor, the tokens each sequence receives) is tested without a GPU; the
// GPU's group is bench_parallel_gpu.cpp, the report bench_parallel_report.cpp.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "bench_model.h"

namespace activekv::cli {

/// N histories against one model (GPU: runtime::GpuModel with N GpuSequences).
class ParallelGroup {
 public:
  virtual ~ParallelGroup() = default;
  virtual int size() const = 0;
  /// Sequences one forward pass may advance (GPU: cuda::kMaxMatvecVectors).
  virtual int max_batch() const = 0;
  virtual int64_t n_tokens(int seq) const = 0;
  /// Appends `tokens` to sequence `seq` through the prefill path; returns the token sampled after them.
  virtual int32_t prefill(int seq, std::span<const int32_t> tokens) = 0;
  /// One forward pass: sequences seqs[k] (distinct, at most max_batch()) each
  /// append tokens[k]; returns the token each sampled, in order.
  virtual std::vector<int32_t> decode_batch(std::span<const int> seqs, std::span<const int32_t> tokens) = 0;
  /// Blocks until every sequence's background conversion has caught up.
  virtual void wait_conversions() = 0;
  /// As BenchSession::history_bytes, summed over the sequences.
  virtual double history_bytes() const = 0;
  /// As BenchSession::resident_history_bytes, summed over the sequences.
  virtual double resident_history_bytes() const { return 0; }
  /// Logits of sequence `seq`'s last step, [vocab]; valid right after the
  /// forward pass that ran it (the model's logits buffer is shared).
  virtual std::vector<float> last_logits(int seq) const = 0;
  /// The placement the sequences run ("host", "gpu", "partial"; several: joined by "/").
  virtual std::string placement() const = 0;
  /// One line: the first sequence's plan (empty: none).
  virtual std::string plan() const { return {}; }
};

/// Largest --parallel value accepted.
inline constexpr int kMaxParallel = 1024;

/// Forward passes one step of n sequences takes: ceil(n / max_batch).
/// InvalidArgument for n < 1 or max_batch < 1.
int batch_rounds(int n, int max_batch);

/// The --parallel values in ascending order. Error (one line) for an empty
/// list, a value outside [1, kMaxParallel] or a value given twice.
std::vector<int> parallel_values(std::vector<int> values);

/// --parallel's own checks, before the model loads (device: resolved):
/// CUDA only, decode rows only (-n > 0, no -p), no --cuda-graphs (decode_batch
/// runs kernel by kernel), --seq-gpu-kv-mem only with --parallel and >= 0.
/// Error with one line naming the flag.
void check_parallel_args(const ModelBenchArgs& a, const std::string& device);

/// Tokens each sequence's history must hold: the fill (depth, at least one
/// token) plus, per row (n_rows of them), reps x (a warm-up step and n_gen
/// timed steps) and one check step.
int64_t parallel_context(int64_t depth, int n_rows, int n_gen, int reps);

/// Each sequence's GPU budget: seq_gib GiB when given, else model_budget / n_max.
uint64_t parallel_seq_budget(uint64_t model_budget, int n_max, double seq_gib);

/// The up-front host check: n histories of per_seq bytes each (memory.h's
/// routed_history_bytes) must fit `available` (0: unknown, no check). Error:
/// "not enough memory for bench --parallel N: N histories of <what>: <bytes>
/// asked (N x <bytes>), <available> available (...)".
void require_parallel_host_memory(int n, uint64_t per_seq, const std::string& what, uint64_t available);

/// The up-front GPU check: every sequence's budget must fit the model's
/// (n x seq_budget <= model_budget), and with gpu placement each resident
/// history (per_seq bytes on the device) its sequence's budget. Error with
/// one line: how much is asked, and how much the budget has.
void require_parallel_gpu_budget(int n, const std::string& placement, uint64_t per_seq, uint64_t seq_budget,
                                 uint64_t model_budget, const std::string& what);

/// One history of the run's shape for a -ctk value, for the up-front checks:
/// its description ("32868 tokens of bf16") and its bytes (memory.h's
/// routed_history_bytes: host memory, and GPU memory with gpu placement).
struct ParallelHistory {
  std::string what;
  uint64_t bytes = 0;
};
ParallelHistory parallel_history(const ModelBenchArgs& a, const model::ModelConfig& c, const std::string& format,
                                 int64_t depth);

/// Before the model loads: max(N) histories of the deepest row of every
/// format must fit the host's `available` bytes (require_parallel_host_memory).
void require_parallel_host_fits(const ModelBenchArgs& a, const model::ModelConfig& c, uint64_t available);

/// A step's floor: weight bytes x rounds over the weights' bandwidth plus the
/// step's history bytes over the history path's bandwidth (placement: as
/// BenchDevice::history_gbps) plus its resident bytes (partial) over HBM's.
struct StepFloor {
  double weight_ms = 0, history_ms = 0;
  double total_ms() const { return weight_ms + history_ms; }
};
StepFloor parallel_step_floor(const BenchDevice& d, const std::string& placement, int rounds,
                              double history_bytes_per_step, double resident_bytes_per_step);

/// The driver: for each format, placement and depth, one group of max(N)
/// sequences from d.open_parallel, filled, then one tg row per N (the file
/// comment). Appends rows and fills to `run`. Every sequence's last logits
/// are checked finite after each row (one untimed check step).
/// Before the first group opens, every group's budgets are checked
/// (require_parallel_gpu_budget against d.kv_budget).
void run_parallel_rows(const ModelBenchArgs& a, const BenchDevice& d, const model::ModelConfig& c, BenchRun& run);

/// The --parallel report: the table's body and notes (markdown), and the
/// rows and fills into the JSON document `j` (bench_parallel_report.cpp).
std::string parallel_markdown(const BenchRun& run);
void add_parallel_json(const BenchRun& run, nlohmann::json& j);

#ifdef ACTIVEKV_HAVE_CUDA
/// Loads the model onto the GPU (runtime::GpuModel, --gpu-kv-mem its budget)
/// and sets d.open_parallel and d.kv_budget (bench_parallel_gpu.cpp).
void add_gpu_parallel(BenchDevice& d, const ModelBenchArgs& a, const gguf::File& f, const model::ModelConfig& c);
#endif

}  // namespace activekv::cli
