// `activekv generate`: prompt -> prefill (chunked, with a progress line) ->
// decode loop streaming text -> summary of speed, latency, bytes and memory.
// Flag names follow llama.cpp's llama-cli where one exists.
#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <random>
#include <thread>

#include "activekv/convert/compressed_history.h"
#include "activekv/core/blas.h"
#include "activekv/core/text_file.h"
#include "activekv/model/llama_model.h"
#include "activekv/model/sampler.h"
#include "activekv/tokenizer/tokenizer.h"
#ifdef ACTIVEKV_HAVE_CUDA
#include "activekv/cuda/attention_backend.h"
#endif
#include "commands.h"
#include "memory.h"
#include "options.h"
#include "stats.h"

namespace activekv::cli {
namespace {

struct GenerateArgs {
  std::string model;
  std::optional<std::string> prompt;  // -p given (possibly empty)
  std::string prompt_file;
  int64_t seed = 42;                   // -1: a random seed, printed
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
  std::string device = "cpu";  // cpu | cuda: where the exact attention runs (layers stay on the CPU)
};

std::string prompt_text(const GenerateArgs& a, const Tokenizer& tok) {
  std::string text = a.prompt                 ? *a.prompt
                     : !a.prompt_file.empty() ? read_text_file(a.prompt_file, "prompt file")
                                              : read_text_file(default_prompt_path(), "prompt file");
  if (!a.chat) return text;
  const ChatMessage msg{"user", text};
  return tok.apply_chat_template(std::span<const ChatMessage>(&msg, 1), true);
}

struct Timings {
  double load_ms = 0, prefill_ms = 0;
  std::vector<double> step_ms;
  int generated = 0;         // tokens sampled and printed
  bool end_of_text = false;  // the model sampled end-of-text before -n was reached
  route::RouteReport decode_route;  // pages, tiles and bytes read by the decode steps
};

// --kv-format: bf16/f32 are exact routes over pages of that format; the
// compressed formats read bf16 pages converted in the background.
struct HistoryPlan {
  kv::PageFormat page_format = kv::PageFormat::bf16;
  route::RouteKind route = route::RouteKind::exact;
  std::vector<kv::CodecFormat> codecs;
};

HistoryPlan plan_history(const std::string& kv_format) {
  if (kv_format == "bf16" || kv_format == "f32") return {kv::parse_page_format(kv_format), route::RouteKind::exact, {}};
  const route::RouteKind kind = route::parse_kind(kv_format);
  const kv::CodecFormat codec =
      kind == route::RouteKind::lossless13 ? kv::CodecFormat::lossless13 : kv::CodecFormat::int8s;
  return {kv::PageFormat::bf16, kind, {codec}};
}

void print_summary(const Timings& t, size_t n_prompt, const model::ModelConfig& c, const std::string& kv_format,
                   int threads) {
  const size_t n_gen = t.step_ms.size();
  double decode_ms = 0;
  for (double s : t.step_ms) decode_ms += s;
  fmt::print(stderr, "\n\n--- activekv summary ({}, {} threads) ---\n", c.name.empty() ? c.arch : c.name, threads);
  fmt::print(stderr, "model load           {:10.1f} ms\n", t.load_ms);
  fmt::print(stderr, "prompt tokens        {:10d}\n", n_prompt);
  fmt::print(stderr, "prefill              {:10.1f} tokens/s ({:.1f} ms)\n",
             t.prefill_ms > 0 ? 1000.0 * double(n_prompt) / t.prefill_ms : 0.0, t.prefill_ms);
  if (n_gen == 0) {
    fmt::print(stderr, "decode               no decode step was run (-n below 2, or end of text at once)\n");
  } else {
    fmt::print(stderr, "decode               {:10.2f} tokens/s ({} tokens, {:.1f} ms)\n",
               1000.0 * double(n_gen) / decode_ms, n_gen, decode_ms);
    fmt::print(stderr, "per-token latency    median {:.2f} ms, p90 {:.2f} ms\n", quantile(t.step_ms, 0.5),
               quantile(t.step_ms, 0.9));
  }
  const auto& r = t.decode_route;
  const double steps = double(std::max<size_t>(n_gen, 1));
  fmt::print(stderr, "history read/token   {:10.2f} MiB ({}; per step {:.0f} exact + {:.0f} lossless13 + {:.0f} int8s pages)\n",
             r.bytes / steps / (1024.0 * 1024.0), kv_format, double(r.pages[0]) / steps,
             double(r.pages[1]) / steps, double(r.pages[2]) / steps);
  if (t.end_of_text) fmt::print(stderr, "stopped at end of text after {} tokens\n", t.generated);
  fmt::print(stderr, "peak RSS             {:10.1f} MiB\n", double(peak_rss_bytes()) / (1024.0 * 1024.0));
}

// Argument combinations that cannot work, rejected before the model loads.
void check_args(const GenerateArgs& a) {
  if (a.device == "cuda" && a.kv_format != "bf16") {
    throw Error(fmt::format("--device cuda supports --kv-format bf16 only, not '{}'", a.kv_format));
  }
#ifndef ACTIVEKV_HAVE_CUDA
  if (a.device == "cuda") throw Error("--device cuda: this activekv was built without the CUDA backend (ACTIVEKV_CUDA=OFF)");
#endif
  if (a.prompt && !a.prompt_file.empty()) throw Error("give either -p or -f, not both");
  if (!std::isfinite(a.sampling.temperature)) {
    throw InvalidArgument(fmt::format("--temp must be a finite number, got {}", a.sampling.temperature));
  }
  if (!(a.sampling.top_p > 0.0f && a.sampling.top_p <= 1.0f)) {  // also rejects NaN
    throw InvalidArgument(fmt::format("--top-p must be in (0, 1], got {}", a.sampling.top_p));
  }
}

// Samples, streams and runs one forward step per token; times each step.
void decode_loop(const GenerateArgs& a, model::LlamaModel& lm, const Tokenizer& tok, kv::SequenceKv& seq,
                 convert::CompressedHistory* compressed, const route::RoutedView& view, model::Sampler& sampler,
                 std::vector<float>& logits, Timings& t) {
  for (int i = 0; i < a.n_predict; ++i) {
    const auto ts = std::chrono::steady_clock::now();
    const int32_t id = sampler.sample(logits);
    if (tok.is_end_of_generation(id)) {
      t.end_of_text = true;
      break;
    }
    fmt::print("{}", tok.token_to_piece(id));
    ++t.generated;
    std::fflush(stdout);
    if (i + 1 == a.n_predict) break;  // the last token needs no forward pass
    const int32_t one[1] = {id};
    lm.forward(one, seq, logits, false, &view);
    if (compressed) compressed->schedule();
    t.step_ms.push_back(ms_since(ts));
  }
}

int run(const GenerateArgs& a) {
  check_args(a);
  omp_set_num_threads(a.threads);
  set_blas_threads(a.threads);
  Timings t;
  auto t0 = std::chrono::steady_clock::now();
  const std::string model_path = a.model.empty() ? default_model_path() : a.model;
  const gguf::File file = gguf::File::open(model_path);
  const Tokenizer tok = Tokenizer::from_gguf(file);
  model::ForwardOptions fopt;
  fopt.prefill_chunk = a.prefill_chunk;
  fopt.attention.tile_pages = a.tile_pages;
  model::LlamaModel lm = load_weights_checked(file, model_path, [&] { return model::LlamaModel(file, fopt); });
  const model::ModelConfig& c = lm.config();
  t.load_ms = ms_since(t0);

  const std::vector<int32_t> prompt = tok.encode(prompt_text(a, tok), tok.add_bos_default());
  if (prompt.empty()) throw Error("the prompt is empty");
  const int64_t n_ctx = a.n_ctx > 0 ? a.n_ctx : int64_t(prompt.size()) + a.n_predict;
  if (int64_t(prompt.size()) + a.n_predict > n_ctx) {
    throw Error(fmt::format("prompt of {} tokens plus -n {} exceeds the context -c {}", prompt.size(),
                            a.n_predict, n_ctx));
  }
  if (n_ctx > c.context_length) {
    fmt::print(stderr, "warning: context {} exceeds the model's trained context {}\n", n_ctx, c.context_length);
  }
  const HistoryPlan plan = plan_history(a.kv_format);
  const kv::KvShape shape = lm.kv_shape(a.page_size, plan.page_format);
  const size_t pages_per_layer = size_t((n_ctx + a.page_size - 1) / a.page_size);
  require_page_store(shape, n_ctx);  // pages are allocated as the history grows: refuse now, not hours in
  kv::PageStore store(shape, pages_per_layer * size_t(c.n_layers));
  kv::SequenceKv seq(store);
  std::unique_ptr<convert::ConversionPool> pool;
  if (!plan.codecs.empty()) pool = std::make_unique<convert::ConversionPool>(a.convert_threads);
  // Declared after seq: destroyed (its conversions cancelled) before seq frees its pages.
  std::unique_ptr<convert::CompressedHistory> compressed;
  if (pool) compressed = std::make_unique<convert::CompressedHistory>(seq, plan.codecs, pages_per_layer, pool.get());
  route::RoutedView view;
  view.compressed = compressed.get();
  view.config = {plan.route, a.recent_pages, a.tile_pages};
  model::SamplerParams sampling = a.sampling;
  sampling.seed = a.seed >= 0 ? uint64_t(a.seed) : uint64_t(std::random_device{}()) << 32 | std::random_device{}();
  if (a.seed < 0) fmt::print(stderr, "seed {}\n", sampling.seed);
  model::Sampler sampler(sampling);
#ifdef ACTIVEKV_HAVE_CUDA
  // --device cuda: every layer's attention on the GPU (lm keeps a non-owning
  // pointer and calls it only inside forward); the model layers stay on the CPU.
  std::unique_ptr<cuda::CudaAttentionBackend> gpu_attention;
  if (a.device == "cuda") {
    gpu_attention = std::make_unique<cuda::CudaAttentionBackend>(shape, c.n_heads);
    fopt.attention_backend = gpu_attention.get();
    lm.set_options(fopt);
    fmt::print(stderr, "activekv: attention on {} (flash-style prefill kernel), model layers on the CPU\n",
               gpu_attention->device_name());
  }
#endif

  fmt::print(stderr, "activekv: {} | {} layers, {} KV heads x {} | {} history, page {} tokens, tile {} pages | {} prompt tokens\n",
             model_path, c.n_layers, c.n_kv_heads, c.head_dim, a.kv_format, a.page_size, a.tile_pages, prompt.size());
  t0 = std::chrono::steady_clock::now();
  // On a terminal the progress line redraws itself; in a log, one line per chunk.
  const char* progress_end = isatty(STDERR_FILENO) ? "" : "\n";
  const char* progress_start = isatty(STDERR_FILENO) ? "\r" : "";
  std::vector<float> logits = lm.prefill(prompt, seq, [&](int64_t done, int64_t total) {
    const double ms = ms_since(t0);
    fmt::print(stderr, "{}prefill {:6d}/{} tokens  {:7.1f} tokens/s{}", progress_start, done, total,
               1000.0 * double(done) / ms, progress_end);
    std::fflush(stderr);
  }, &view);
  t.prefill_ms = ms_since(t0);
  if (!*progress_end) fmt::print(stderr, "\n");
  if (!a.chat) {
    fmt::print("{}", !a.prompt && a.prompt_file.empty() ? "[...] " : "");
  }

  view.report = &t.decode_route;
  decode_loop(a, lm, tok, seq, compressed.get(), view, sampler, logits, t);
  print_summary(t, prompt.size(), c, a.kv_format, a.threads);
  return 0;
}

}  // namespace

void add_generate(CLI::App& app, std::function<int()>& run_fn) {
  auto a = std::make_shared<GenerateArgs>();
  app.add_option("-m,--model", a->model, "GGUF model file (default: $ACTIVEKV_MODEL, else the installed SmolLM2-135M-Instruct)");
  app.add_option("-p,--prompt", a->prompt, "Prompt text");
  app.add_option("-f,--file", a->prompt_file, "Read the prompt from a file (default: data/default_prompt.txt)");
  app.add_option("-n,--n-predict", a->n_predict, "Tokens to generate")->capture_default_str()->check(count_range(0));
  app.add_option("-c,--ctx-size", a->n_ctx, "Context size in tokens (0 = prompt + n-predict)")->capture_default_str()->check(CLI::NonNegativeNumber);
  add_threads_option(app, a->threads);
  app.add_option("--temp", a->sampling.temperature, "Temperature (<= 0: greedy)")->capture_default_str();
  app.add_option("--top-k", a->sampling.top_k, "Top-k (<= 0: off)")->capture_default_str();
  app.add_option("--top-p", a->sampling.top_p, "Top-p in (0, 1]")->capture_default_str();
  app.add_option("--seed", a->seed, "Sampling seed (-1: random, printed)")->capture_default_str()
      ->check(CLI::Range(int64_t(-1), std::numeric_limits<int64_t>::max()));
  app.add_flag("--chat", a->chat, "Wrap the prompt in the model's ChatML chat template");
  add_page_size_option(app, a->page_size);
  app.add_option("--kv-format", a->kv_format,
                 "History format: bf16 (exact tier), f32 (reference), lossless13, int8s, or hybrid "
                 "(exact sink/recent/tail, int8s between)")
      ->capture_default_str()->check(CLI::IsMember({"bf16", "f32", "lossless13", "int8s", "hybrid"}));
  add_recent_pages_option(app, a->recent_pages);
  app.add_option("--convert-threads", a->convert_threads, "Background page-conversion threads")
      ->capture_default_str()->check(CLI::Range(1, 256));
  app.add_option("--tile-pages", a->tile_pages, "Pages per attention tile")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--device", a->device, "Where the attention runs: cpu, or cuda (exact bf16 history on the GPU; model layers stay on the CPU)")
      ->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--prefill-chunk", a->prefill_chunk, "Tokens per prefill forward pass")->capture_default_str()->check(CLI::Range(1, 1 << 16));
  run_fn = [a] { return run(*a); };
}

}  // namespace activekv::cli
