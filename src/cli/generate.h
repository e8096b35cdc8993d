// `activekv generate`, shared by its CPU path (generate.cpp) and its GPU path
// (generate_gpu.cpp, CUDA builds): the arguments, what a run reports, and the
// pieces both paths use.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "activekv/model/sampler.h"
#ifdef ACTIVEKV_HAVE_CUDA
#include "activekv/runtime/gpu_runtime.h"
#endif
#include "activekv/route/route.h"
#include "activekv/tokenizer/tokenizer.h"
#include "options.h"

namespace activekv::cli {

struct GenerateArgs {
  std::string model;
  std::optional<std::string> prompt;  // -p given (possibly empty)
  std::string prompt_file;
  int64_t seed = 42;                  // -1: a random seed, printed
  int n_predict = 128;
  int n_ctx = 0;  // 0: prompt + n_predict
  int threads = default_threads();
  model::SamplerParams sampling;
  bool chat = false;
  int page_size = 1024;
  std::string kv_format = "bf16";
  int recent_pages = 2;
  int convert_threads = 1;
  int tile_pages = 32;
  int prefill_chunk = 256;
  std::string device = "auto";        // auto | cpu | cuda
  std::string kv_placement = "auto";  // host | gpu | partial | auto (GPU only)
  double gpu_kv_mem_gib = 0;          // GPU budget for the history; 0 = free memory less a margin
  std::string matvec_activations = "int8";  // int8 | f32 (GPU only)
  std::string cuda_graphs = "auto";    // on | off: gpu-placement decode steps as CUDA graphs (GPU only)
  double cpu_share = kCpuShareUnset;  // GPU, host/partial placement: share of each layer's pages the CPU attends
                                      // (issue 12); -1 auto; unset: resolve_cpu_share
  std::string json_out;               // --json: the report as JSON
  std::vector<int> gpus;              // --gpus: tensor parallel over these GPUs (one shard each; empty: one GPU)
};

/// What a run reports (the summary, and --json).
struct GenerationReport {
  std::string model_path, model_name, device, kv_format, placement;
  std::string layers;           ///< ModelConfig::layer_split(): "15 sliding (window 512) + 3 global"
  int threads = 0;
  int64_t prompt_tokens = 0;
  double load_ms = 0, prefill_ms = 0;
  std::vector<double> step_ms;  ///< one per decode step (a forward pass and a sample)
  int generated = 0;            ///< tokens sampled and printed
  bool end_of_text = false;     ///< the model sampled end-of-text before -n was reached
  route::RouteReport decode_route;  ///< pages, tiles and bytes read by the decode steps
  double streamed_bytes = -1;   ///< GPU: history bytes copied host -> device, all steps (-1: n/a)
  double resident_bytes = -1;   ///< GPU: history bytes read in place on the GPU, all steps
  double cpu_bytes = -1;        ///< GPU: history bytes the host CPU attended in place, all steps (co-attention)
  double cpu_share = 0;         ///< GPU: --cpu-share (-1: auto)
  std::string co_attention;     ///< GPU, --cpu-share auto: measured rates and the last step's plan
  double sliding_bytes = -1;    ///< GPU: of resident_bytes, read by the sliding layers from their GPU rings
  /// GPU: page-table entries of the global layers, all decode steps: with a
  /// device copy, streamed, attended by the host CPU (-1: n/a).
  double pages_resident = -1, pages_streamed = -1, pages_cpu = -1;
  double residency_upload_bytes = -1;  ///< GPU, partial placement: bytes uploaded to make pages resident
  double ring_bytes = -1;       ///< GPU: device bytes of the sliding layers' rings
  double weight_bytes = -1;     ///< GPU: weights on the GPU, in their GGUF types
  std::string prefill_history;  ///< GPU: where the prompt's history lived during prefill (one line)
  double prefill_moved_bytes = -1;  ///< GPU: history bytes a streamed prefill copied host -> device
};

/// The prompt as text (-p, -f or the default prompt file), in the chat template with --chat.
std::string prompt_text(const GenerateArgs& a, const Tokenizer& tok);
/// Token ids of the prompt; Error if empty, or if it plus -n exceeds -c.
std::vector<int32_t> prompt_ids(const GenerateArgs& a, const Tokenizer& tok);
/// The context: -c, or prompt + -n.
int64_t context_size(const GenerateArgs& a, size_t prompt_tokens);
/// The sampler parameters with the seed resolved (--seed -1: random, printed).
model::SamplerParams sampler_params(const GenerateArgs& a);
/// A progress callback for prefill: redraws one line on a terminal, one line per chunk in a log.
std::function<void(int64_t, int64_t)> prefill_progress(std::chrono::steady_clock::time_point t0);
/// Streams one token's text to stdout (false: end of text, nothing printed).
bool emit_token(const Tokenizer& tok, int32_t id, GenerationReport& r);

/// Prints the summary to stderr and, with --json, writes it.
void report(const GenerateArgs& a, const GenerationReport& r);
/// Prints generated text to stdout (flushed); report() ends its line with a
/// newline if the text did not, so what prints next starts a line of its own.
void print_generated(const std::string& text);

/// --device: "auto" becomes "cuda" when this build has the CUDA backend and a
/// usable GPU is present, else "cpu". Throws Error for "cuda" in a CPU-only build.
std::string resolve_device(const std::string& device);
/// Why the CPU runs: "" unless `requested` is "auto" and it resolved to
/// "cpu"; then the reason (no CUDA backend in this build, or the CUDA
/// runtime's reason for having no usable GPU), which the startup line and the
/// summary print, so that a CUDA build that ran on the CPU says why.
std::string auto_cpu_reason(const std::string& requested, const std::string& device);

#ifdef ACTIVEKV_HAVE_CUDA
/// The GPU path: the whole model on the GPU, the history in pinned host pages.
int run_generate_gpu(const GenerateArgs& a);
/// The runtime's options as `a` asks, for a history of n_ctx tokens.
runtime::RuntimeOptions runtime_options(const GenerateArgs& a, int64_t n_ctx);
/// The summary's one line on where the history is read and why: the
/// placement's reason (partial: the resident pages per layer) and the host
/// CPU's share (runtime cpu_share: -1 auto).
std::string placement_line(const runtime::RuntimeStats& st, double cpu_share);
#endif

}  // namespace activekv::cli
