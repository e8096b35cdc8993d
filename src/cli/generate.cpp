// `activekv generate`: prompt -> prefill (chunked, with a progress line) ->
// decode loop streaming text -> summary of speed, latency, bytes and memory.
// Flag names follow llama.cpp's llama-cli where one exists. This file holds
// the flags, the CPU path and what both paths share; the GPU path (the whole
// model on the GPU, the history in pinned host pages) is generate_gpu.cpp.
#include "generate.h"
#include "options.h"

#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "activekv/convert/compressed_history.h"
#include "activekv/core/blas.h"
#include "activekv/core/text_file.h"
#ifdef ACTIVEKV_HAVE_CUDA
#include "activekv/cuda/decode_attention.h"  // gpu_absence_reason
#endif
#include "activekv/model/llama_model.h"
#include "commands.h"
#include "cpu_session.h"
#include "memory.h"
#include "provenance.h"
#include "stats.h"

namespace activekv::cli {

// 256 MiB: some 60M tokens, far past any context; a device such as /dev/zero
// given as the prompt file stops there instead of at the end of memory.
constexpr size_t kMaxPromptFileBytes = size_t(256) << 20;

std::string prompt_text(const GenerateArgs& a, const Tokenizer& tok) {
  std::string text = a.prompt ? *a.prompt
                     : read_text_file(a.prompt_file.empty() ? default_prompt_path() : a.prompt_file, "prompt file",
                                      kMaxPromptFileBytes);
  if (!a.chat) return text;
  const ChatMessage msg{"user", text};
  return tok.apply_chat_template(std::span<const ChatMessage>(&msg, 1), true);
}

int64_t context_size(const GenerateArgs& a, size_t prompt_tokens) {
  return a.n_ctx > 0 ? a.n_ctx : int64_t(prompt_tokens) + a.n_predict;
}

std::vector<int32_t> prompt_ids(const GenerateArgs& a, const Tokenizer& tok) {
  std::vector<int32_t> prompt = tok.encode(prompt_text(a, tok), tok.add_bos_default());
  if (prompt.empty()) throw Error("the prompt is empty");
  const int64_t n_ctx = context_size(a, prompt.size());
  if (int64_t(prompt.size()) + a.n_predict > n_ctx) {
    throw Error(fmt::format("prompt of {} tokens plus -n {} exceeds the context -c {}", prompt.size(), a.n_predict,
                            n_ctx));
  }
  return prompt;
}

model::SamplerParams sampler_params(const GenerateArgs& a) {
  model::SamplerParams s = a.sampling;
  // A random seed within --seed's range, so that the printed one can be given back.
  s.seed = a.seed >= 0 ? uint64_t(a.seed)
                       : (uint64_t(std::random_device{}()) << 32 | std::random_device{}()) & 0x7fffffffffffffffull;
  if (a.seed < 0) fmt::print(stderr, "seed {}\n", s.seed);
  return s;
}

std::function<void(int64_t, int64_t)> prefill_progress(std::chrono::steady_clock::time_point t0) {
  // On a terminal the progress line redraws itself; in a log, one line per chunk.
  const bool tty = isatty(STDERR_FILENO);
  return [t0, tty](int64_t done, int64_t total) {
    fmt::print(stderr, "{}prefill {:6d}/{} tokens  {:7.1f} tokens/s{}", tty ? "\r" : "", done, total,
               1000.0 * double(done) / ms_since(t0), tty && done < total ? "" : "\n");
    std::fflush(stderr);
  };
}

namespace {
bool g_text_line_open = false;  // the generated text on stdout does not end in a newline yet
}  // namespace

void print_generated(const std::string& text) {
  if (text.empty()) return;
  fmt::print("{}", text);
  std::fflush(stdout);
  g_text_line_open = text.back() != '\n';
}

bool emit_token(const Tokenizer& tok, int32_t id, GenerationReport& r) {
  if (tok.is_end_of_generation(id)) {
    r.end_of_text = true;
    return false;
  }
  print_generated(tok.token_to_piece(id));
  ++r.generated;
  return true;
}

namespace {

void print_summary(const GenerationReport& r) {
  const size_t n_gen = r.step_ms.size();
  double decode_ms = 0;
  for (double s : r.step_ms) decode_ms += s;
  constexpr double MiB = 1024.0 * 1024.0;
  // The file the user named heads the summary (a README trial found the GGUF's
  // general.name, e.g. "Smollm2 135M 8k Lc100K Mix1 Ep2", hard to place).
  fmt::print(stderr, "\n\n--- activekv summary ({}) ---\n", std::filesystem::path(r.model_path).filename().string());
  fmt::print(stderr, "model                {}\n", r.model_name);
  fmt::print(stderr, "device               {}\n", r.device);
  if (!r.layers.empty()) fmt::print(stderr, "layers               {}\n", r.layers);
  if (!r.placement.empty()) fmt::print(stderr, "kv placement         {}\n", r.placement);
  if (r.weight_bytes >= 0) fmt::print(stderr, "weights on the GPU   {:10.1f} MiB (GGUF types)\n", r.weight_bytes / MiB);
  fmt::print(stderr, "model load           {:10.1f} ms\n", r.load_ms);
  fmt::print(stderr, "prompt tokens        {:10d}\n", r.prompt_tokens);
  fmt::print(stderr, "prefill              {:10.1f} tokens/s ({:.1f} ms)\n",
             r.prefill_ms > 0 ? 1000.0 * double(r.prompt_tokens) / r.prefill_ms : 0.0, r.prefill_ms);
  if (n_gen == 0) {
    fmt::print(stderr, "decode               no decode step was run (-n below 2, or end of text at once)\n");
  } else {
    fmt::print(stderr, "decode               {:10.2f} tokens/s ({} tokens in {:.1f} ms; the first token came with the prefill)\n",
               1000.0 * double(n_gen) / decode_ms, n_gen, decode_ms);
    fmt::print(stderr, "per-token latency    median {:.2f} ms, p90 {:.2f} ms\n", quantile(r.step_ms, 0.5),
               quantile(r.step_ms, 0.9));
  }
  const auto& d = r.decode_route;
  const double steps = double(std::max<size_t>(n_gen, 1));
  fmt::print(stderr, "history read/token   {:10.2f} MiB ({}; per step {:.0f} exact + {:.0f} lossless13 + {:.0f} int8s pages)\n",
             d.bytes / steps / MiB, r.kv_format, double(d.pages[0]) / steps, double(d.pages[1]) / steps,
             double(d.pages[2]) / steps);
  if (!r.prefill_history.empty()) fmt::print(stderr, "prefill history      {}\n", r.prefill_history);
  if (r.streamed_bytes >= 0)
    fmt::print(stderr, "streamed/token       {:10.2f} MiB host -> GPU ({:.2f} MiB read in place on the GPU{}{})\n",
               r.streamed_bytes / steps / MiB, r.resident_bytes / steps / MiB,
               r.ring_bytes > 0 ? fmt::format(", of which {:.2f} MiB by the sliding layers from their rings",
                                              r.sliding_bytes / steps / MiB)
                                : std::string(),
               r.cpu_bytes > 0 ? fmt::format(", {:.2f} MiB attended by the host CPU", r.cpu_bytes / steps / MiB)
                               : std::string());
  if (r.pages_resident >= 0)
    fmt::print(stderr, "kv pages/step        {:.1f} resident, {:.1f} streamed, {:.1f} host CPU (global layers){}\n",
               r.pages_resident / steps, r.pages_streamed / steps, r.pages_cpu / steps,
               r.residency_upload_bytes > 0
                   ? fmt::format("; {:.1f} MiB uploaded once to make pages resident", r.residency_upload_bytes / MiB)
                   : std::string());
  if (!r.co_attention.empty()) fmt::print(stderr, "co-attention         {}\n", r.co_attention);
  if (r.end_of_text) fmt::print(stderr, "stopped at end of text after {} tokens\n", r.generated);
  fmt::print(stderr, "peak RSS             {:10.1f} MiB\n", double(peak_rss_bytes()) / MiB);
}

nlohmann::json report_json(const GenerationReport& r) {
  double decode_ms = 0;
  for (double s : r.step_ms) decode_ms += s;
  const double steps = double(std::max<size_t>(r.step_ms.size(), 1));
  auto or_null = [](double v) { return v < 0 ? nlohmann::json(nullptr) : nlohmann::json(v); };
  return {{"command", command_line()},
          {"commit", git_commit()},
          {"environment", activekv_environment()},
          {"model", r.model_path},
          {"model_name", r.model_name},
          {"layers", r.layers},
          {"device", r.device},
          {"threads", r.threads},
          {"kv_format", r.kv_format},
          {"kv_placement", r.placement},
          {"prompt_tokens", r.prompt_tokens},
          {"generated_tokens", r.generated},
          {"end_of_text", r.end_of_text},
          {"load_ms", r.load_ms},
          {"prefill_ms", r.prefill_ms},
          {"prefill_tokens_per_s", r.prefill_ms > 0 ? 1000.0 * double(r.prompt_tokens) / r.prefill_ms : 0.0},
          {"decode_steps", r.step_ms.size()},
          {"decode_tokens_per_s", decode_ms > 0 ? 1000.0 * double(r.step_ms.size()) / decode_ms : 0.0},
          {"latency_ms_median", quantile(r.step_ms, 0.5)},
          {"latency_ms_p90", quantile(r.step_ms, 0.9)},
          {"history_bytes_per_token", r.decode_route.bytes / steps},
          {"streamed_bytes_per_token", or_null(r.streamed_bytes < 0 ? -1 : r.streamed_bytes / steps)},
          {"resident_bytes_per_token", or_null(r.resident_bytes < 0 ? -1 : r.resident_bytes / steps)},
          {"cpu_attended_bytes_per_token", or_null(r.cpu_bytes < 0 ? -1 : r.cpu_bytes / steps)},
          {"cpu_share", r.cpu_bytes < 0 ? nlohmann::json(nullptr)
                                        : r.cpu_share < 0 ? nlohmann::json("auto") : nlohmann::json(r.cpu_share)},
          {"pages_per_step_by_place",
           r.pages_resident < 0 ? nlohmann::json(nullptr)
                                : nlohmann::json{{"resident", r.pages_resident / steps},
                                                 {"streamed", r.pages_streamed / steps},
                                                 {"cpu", r.pages_cpu / steps}}},
          {"residency_upload_bytes", or_null(r.residency_upload_bytes)},
          {"co_attention", r.co_attention},
          {"sliding_ring_bytes_per_token", or_null(r.sliding_bytes < 0 ? -1 : r.sliding_bytes / steps)},
          {"ring_bytes_gpu", or_null(r.ring_bytes)},
          {"weight_bytes_gpu", or_null(r.weight_bytes)},
          {"prefill_history", r.prefill_history},
          {"prefill_moved_bytes", or_null(r.prefill_moved_bytes)},
          {"pages_per_step", {{"exact", double(r.decode_route.pages[0]) / steps},
                              {"lossless13", double(r.decode_route.pages[1]) / steps},
                              {"int8s", double(r.decode_route.pages[2]) / steps}}},
          {"peak_rss_bytes", peak_rss_bytes()}};
}

CpuHistoryOptions history_options(const GenerateArgs& a) {
  return {a.kv_format, a.page_size, a.recent_pages, a.tile_pages, a.convert_threads};
}

// Argument combinations that cannot work, rejected before the model loads.
void check_args(const GenerateArgs& a, const std::string& device) {
  if (a.prompt && !a.prompt_file.empty()) throw Error("give either -p or -f, not both");
  if (device == "cuda" && a.kv_format == "f32")
    throw Error("--kv-format f32 is the CPU path's reference format; on the GPU use bf16, lossless13, int8s or hybrid");
  if (device == "cpu" && (a.kv_placement != "auto" || a.gpu_kv_mem_gib > 0 || a.matvec_activations != "int8" ||
                          a.cuda_graphs == "on" || a.cpu_share != kCpuShareUnset))
    throw Error("--kv-placement, --gpu-kv-mem, --matvec-activations, --cuda-graphs and --cpu-share apply to --device "
                "cuda only");
  if (!a.gpus.empty()) {
    if (device != "cuda")
      throw Error(a.device == "auto" ? "--gpus needs a GPU, and none is usable here (--device auto chose the CPU)"
                                     : "--gpus needs the GPU path (--device cuda)");
    if (a.cpu_share != kCpuShareUnset && a.cpu_share != 0)
      throw Error("--gpus cannot give pages to the CPU (--cpu-share) yet");
    if (a.cuda_graphs == "on") throw Error("--gpus runs kernel by kernel: leave out --cuda-graphs on");
    for (int g : a.gpus)
      if (g < 0) throw Error(fmt::format("--gpus: device {} is negative", g));
  }
  if (!a.json_out.empty()) {
    check_writable(a.json_out, "generate --json output");
    check_not_an_input(a.json_out, {a.model.empty() ? default_model_path() : a.model, a.prompt_file},
                       "generate --json output");
  }
}

// Samples, streams and runs one forward step per token; times each step.
void decode_loop(const GenerateArgs& a, const Tokenizer& tok, CpuSession& session, GenerationReport& r) {
  for (int i = 0; i < a.n_predict; ++i) {
    const auto ts = std::chrono::steady_clock::now();
    const int32_t id = session.sample();
    if (!emit_token(tok, id, r)) break;
    if (i + 1 == a.n_predict) break;  // the last token needs no forward pass
    session.step(id);
    r.step_ms.push_back(ms_since(ts));
  }
}

int run_cpu(const GenerateArgs& a) {
  omp_set_num_threads(a.threads);
  set_blas_threads(a.threads);
  GenerationReport r;
  auto t0 = std::chrono::steady_clock::now();
  r.model_path = a.model.empty() ? default_model_path() : a.model;
  const gguf::File file = gguf::File::open(r.model_path);
  const Tokenizer tok = Tokenizer::from_gguf(file);
  model::ForwardOptions fopt;
  fopt.prefill_chunk = a.prefill_chunk;
  fopt.attention.tile_pages = a.tile_pages;
  model::LlamaModel lm = load_weights_checked(file, r.model_path, [&] { return model::LlamaModel(file, fopt); });
  const model::ModelConfig& c = lm.config();
  r.load_ms = ms_since(t0);
  r.model_name = c.name.empty() ? c.arch : c.name;
  r.layers = c.layer_split();
  const std::string why_cpu = auto_cpu_reason(a.device, "cpu");
  r.device = fmt::format("cpu ({} threads, OpenBLAS {} kernels{})", a.threads, blas_core_name(),
                         why_cpu.empty() ? "" : "; " + why_cpu);
  r.threads = a.threads;
  r.kv_format = a.kv_format;

  const std::vector<int32_t> prompt = prompt_ids(a, tok);
  const int64_t n_ctx = context_size(a, prompt.size());
  if (n_ctx > c.context_length) {
    fmt::print(stderr, "warning: context {} exceeds the model's trained context {}\n", n_ctx, c.context_length);
  }
  CpuSession session(lm, history_options(a), n_ctx, sampler_params(a));

  fmt::print(stderr, "activekv: {} | cpu, {} threads | {} layers ({}), {} KV heads x {} | {} history, page {} tokens, "
             "tile {} pages | {} prompt tokens\n",
             r.model_path, a.threads, c.n_layers, r.layers, c.n_kv_heads, c.head_dim, a.kv_format, a.page_size,
             a.tile_pages, prompt.size());
  r.prompt_tokens = int64_t(prompt.size());
  t0 = std::chrono::steady_clock::now();
  session.prefill(prompt, prefill_progress(t0));
  r.prefill_ms = ms_since(t0);
  if (!a.chat && !a.prompt && a.prompt_file.empty()) print_generated("[...] ");
  session.history().view().report = &r.decode_route;
  decode_loop(a, tok, session, r);
  report(a, r);
  return 0;
}

int run(const GenerateArgs& a) {
  const std::string device = resolve_device(a.device);
  check_args(a, device);
#ifdef ACTIVEKV_HAVE_CUDA
  if (device == "cuda") return run_generate_gpu(a);
#endif
  return run_cpu(a);
}

}  // namespace

// --device auto: the GPU when this build has the CUDA backend and a usable GPU is present.
std::string resolve_device(const std::string& device) {
#ifdef ACTIVEKV_HAVE_CUDA
  if (device == "auto") return cuda::gpu_absence_reason().empty() ? "cuda" : "cpu";
#else
  if (device == "auto") return "cpu";
  if (device == "cuda") throw Error("--device cuda: this activekv was built without the CUDA backend (ACTIVEKV_CUDA=OFF)");
#endif
  return device;
}

std::string auto_cpu_reason(const std::string& requested, const std::string& device) {
  if (requested != "auto" || device != "cpu") return "";
#ifdef ACTIVEKV_HAVE_CUDA
  const std::string absent = cuda::gpu_absence_reason();
  return absent.empty() ? "" : "--device auto: " + absent;
#else
  return "--device auto: this build has no CUDA backend (ACTIVEKV_CUDA=OFF)";
#endif
}

void report(const GenerateArgs& a, const GenerationReport& r) {
  if (g_text_line_open) {  // end the text's line: whatever prints next to stdout starts on its own
    print_generated("\n");
  }
  print_summary(r);
  if (!a.json_out.empty()) {
    write_text_file(a.json_out, report_json(r).dump(2) + "\n", "generate --json output");
    fmt::print(stderr, "wrote {}\n", a.json_out);
  }
}

void add_generate(CLI::App& app, std::function<int()>& run_fn) {
  auto a = std::make_shared<GenerateArgs>();
  app.add_option("-m,--model", a->model, "GGUF model file (default: $ACTIVEKV_MODEL, else the installed SmolLM2-135M-Instruct)")
      ->check(non_empty());
  app.add_option("-p,--prompt", a->prompt, "Prompt text");
  app.add_option("-f,--file", a->prompt_file, "Read the prompt from a file (default: data/default_prompt.txt)")
      ->check(non_empty());
  app.add_option("-n,--n-predict", a->n_predict, "Tokens to generate")->capture_default_str()->check(count_range(0));
  app.add_option("-c,--ctx-size", a->n_ctx, "Context size in tokens (0 = prompt + n-predict)")->capture_default_str()
      ->check(in_range(0, std::numeric_limits<int>::max()));  // any int: too large is a memory error, with sizes
  add_threads_option(app, a->threads);
  app.add_option("--temp", a->sampling.temperature, "Temperature (<= 0: greedy)")
      ->check(finite_number<float>())
      ->capture_default_str();
  app.add_option("--top-k", a->sampling.top_k, "Top-k (<= 0: off)")->capture_default_str()
      ->check(in_range(std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
  app.add_option("--top-p", a->sampling.top_p, "Top-p in (0, 1]")->check(above_zero_to_one())->capture_default_str();
  app.add_option("--seed", a->seed, "Sampling seed (-1: random, printed)")->capture_default_str()
      ->check(seed_value());
  app.add_flag("--chat", a->chat, "Wrap the prompt in the model's chat template (ChatML; Gemma's turn format for gemma3)");
  add_page_size_option(app, a->page_size);
  app.add_option("--kv-format", a->kv_format,
                 "History format: bf16 (exact tier), f32 (CPU reference), lossless13, int8s, or hybrid "
                 "(exact sink/recent/tail, int8s between)")
      ->capture_default_str()->check(CLI::IsMember({"bf16", "f32", "lossless13", "int8s", "hybrid"}));
  add_recent_pages_option(app, a->recent_pages);
  app.add_option("--convert-threads", a->convert_threads, "Background page-conversion threads")
      ->capture_default_str()->check(in_range(1, 256));
  app.add_option("--tile-pages", a->tile_pages, "Pages per attention tile (GPU: per streamed copy job)")
      ->capture_default_str()->check(in_range(1, 1 << 20));
  app.add_option("--device", a->device,
                 "auto (the GPU when one is usable, else the CPU), cpu, or cuda (the whole model on the GPU, "
                 "the history in pinned host memory)")
      ->capture_default_str()->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--kv-placement", a->kv_placement,
                 "GPU: where the history is read each step: host (streamed from pinned host memory), gpu (a "
                 "copy resident on the GPU), partial (the hot pages resident within --gpu-kv-mem, the rest "
                 "streamed), auto (gpu if it fits --gpu-kv-mem, else partial, with --cpu-share auto)")
      ->capture_default_str()->check(CLI::IsMember({"auto", "host", "gpu", "partial"}));
  app.add_option("--gpu-kv-mem", a->gpu_kv_mem_gib, "GPU: GiB the history's device pages may use (0: free memory less a margin); a prompt whose history does not fit streams during prefill")
      ->capture_default_str()->check(non_negative());
  app.add_option("--matvec-activations", a->matvec_activations,
                 "GPU: projections take int8-rounded activations in decode and bf16 in prefill (int8, as "
                 "llama.cpp; fast) or fp32 ones throughout (f32: the CPU path's arithmetic, for comparisons; slower)")
      ->capture_default_str()->check(CLI::IsMember({"int8", "f32"}));
  add_cuda_graphs_option(app, a->cuda_graphs);
  add_cpu_share_option(app, a->cpu_share);
  app.add_option("--gpus", a->gpus,
                 "GPU: tensor parallel over these GPUs, one shard of the heads and FFN rows each, e.g. 0,1 (each "
                 "GPU streams its heads' history over its own link; 0,0 runs two shards on GPU 0); no --cpu-share, "
                 "kernel by kernel (no CUDA graphs)")
      ->delimiter(',');
  app.add_option("--prefill-chunk", a->prefill_chunk, "Tokens per prefill forward pass")->capture_default_str()->check(in_range(1, 1 << 16));
  app.add_option("--json", a->json_out, "Also write the summary as JSON to this file (with command and commit)")
      ->check(non_empty());
  run_fn = [a] { return run(*a); };
}

}  // namespace activekv::cli
