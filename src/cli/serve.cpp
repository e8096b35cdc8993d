// `activekv serve`: flags (llama-server's and vLLM's names where they exist)
// -> serve::ServeOptions -> serve::run_server (src/serve, docs/serve.md).
// Without cpp-httplib at configure time the subcommand stays, saying so.


#include "activekv/core/error.h"
#ifdef ACTIVEKV_HAVE_CUDA
#include "activekv/cuda/decode_attention.h"
#endif
#include "commands.h"
#include "generate.h"
#include "options.h"
#ifdef ACTIVEKV_HAVE_SERVE
#include "activekv/serve/server.h"
#endif

namespace activekv::cli {

namespace {

struct ServeArgs {
  std::string model, model_name, host = "127.0.0.1", api_key, device = "auto", kv_format = "bf16";
  std::string kv_placement = "auto";
  int port = 8080, threads = default_threads(), max_seqs = 8, max_queue = 64, n_ctx = 0;
  int page_size = 1024, recent_pages = 2, tile_pages = 32, convert_threads = 1, prefill_chunk = 256;
  double host_kv_mem_gib = 0, gpu_kv_mem_gib = 0, drain_seconds = 5, itl_target_ms = 0;
  bool sync_conversion = false;
};

int run(const ServeArgs& a) {
#ifdef ACTIVEKV_HAVE_SERVE
  serve::block_stop_signals();  // first: the GPU probe below starts the CUDA driver's threads
#endif
  // auto: the GPU runtime when this build has it and a GPU is usable, as for
  // generate and bench -- but for --kv-format f32, which only the CPU path
  // reads. (--device cuda in a CPU-only build, or without a GPU: one line.)
  std::string device = resolve_device(a.device);
  if (a.device == "auto" && a.kv_format == "f32") device = "cpu";
  if (device == "cpu" && (a.kv_placement != "auto" || a.gpu_kv_mem_gib > 0))
    throw Error("--kv-placement and --gpu-kv-mem apply to --device cuda");
  if (device == "cuda" && a.kv_format == "f32")
    throw Error("--kv-format f32 is the CPU path's reference format; on the GPU use bf16, lossless13, int8s or hybrid");
#ifdef ACTIVEKV_HAVE_CUDA
  if (device == "cuda") cuda::require_gpu(0, "serve --device cuda");  // one line, before binding the port
#endif
#ifdef ACTIVEKV_HAVE_SERVE
  serve::ServeOptions o;
  o.model_path = a.model.empty() ? default_model_path() : a.model;
  o.model_name = a.model_name;
  o.host = a.host;
  o.port = a.port;
  o.api_key = a.api_key;
  o.device = device;
  o.kv_placement = a.kv_placement;
  o.gpu_kv_mem_gib = a.gpu_kv_mem_gib;
  o.threads = a.threads;
  o.n_ctx = a.n_ctx;
  o.max_seqs = a.max_seqs;
  o.max_queue = a.max_queue;
  o.host_kv_mem_gib = a.host_kv_mem_gib;
  o.kv_format = a.kv_format;
  o.page_size = a.page_size;
  o.recent_pages = a.recent_pages;
  o.tile_pages = a.tile_pages;
  o.convert_threads = a.convert_threads;
  o.prefill_chunk = a.prefill_chunk;
  o.sync_conversion = a.sync_conversion;
  o.itl_target_s = a.itl_target_ms / 1000.0;
  o.drain_seconds = a.drain_seconds;
  return serve::run_server(o);
#else
  throw Error("serve: this activekv was built without cpp-httplib (Debian: libcpp-httplib-dev; scripts/setup.sh installs it)");
#endif
}

}  // namespace

void add_serve(CLI::App& app, std::function<int()>& run_fn) {
  auto a = std::make_shared<ServeArgs>();
  app.add_option("-m,--model", a->model, "GGUF model file (default: as generate)")->check(non_empty());
  app.add_option("--served-model-name", a->model_name, "The model id clients name (default: the file name without .gguf)");
  app.add_option("--host", a->host, "Address to listen on")->capture_default_str();
  app.add_option("--port", a->port, "Port (0: any free one, printed)")->capture_default_str()->check(in_range(0, 65535));
  app.add_option("--api-key", a->api_key, "Require \"Authorization: Bearer KEY\" on /v1/*");
  add_threads_option(app, a->threads);
  app.add_option("-c,--ctx-size", a->n_ctx, "Tokens a request may hold, prompt + max_tokens (0: the model's context)")
      ->capture_default_str()->check(count_range(0));
  app.add_option("--max-seqs", a->max_seqs, "Requests decoded at once (one batched step)")->capture_default_str()
      ->check(in_range(1, 4096));
  app.add_option("--max-queue", a->max_queue, "Requests waiting for admission; past it, 429")->capture_default_str()
      ->check(in_range(1, 1 << 16));
  app.add_option("--host-kv-mem", a->host_kv_mem_gib, "GiB of host memory all running histories may hold (0: half of "
                 "MemAvailable at start)")->capture_default_str()->check(non_negative());
  app.add_option("--kv-format", a->kv_format, "History format, as generate")->capture_default_str()
      ->check(CLI::IsMember({"bf16", "f32", "lossless13", "int8s", "hybrid"}));
  app.add_option("--device", a->device, "cpu, or cuda (the GPU runtime: one copy of the weights, a history per "
                 "request, up to 8 requests per batched step); auto: cuda when this build has it and a GPU is usable (but for "
                 "--kv-format f32), else cpu")->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--kv-placement", a->kv_placement, "cuda: where each request's history is read from (host: streamed "
                 "from host memory; gpu: resident; partial: the hot pages resident; auto: gpu when it fits the request's "
                 "share of --gpu-kv-mem, else partial or host)")
      ->capture_default_str()->check(CLI::IsMember({"auto", "host", "gpu", "partial"}));
  app.add_option("--gpu-kv-mem", a->gpu_kv_mem_gib, "cuda: GiB of GPU memory all histories share, 1/--max-seqs per "
                 "request (0: free memory less a margin)")
      ->capture_default_str()->check(non_negative());
  add_page_size_option(app, a->page_size);
  add_recent_pages_option(app, a->recent_pages);
  app.add_option("--tile-pages", a->tile_pages, "Pages per attention tile")->capture_default_str()
      ->check(in_range(1, 1 << 20));
  app.add_option("--convert-threads", a->convert_threads, "Background page-conversion threads per request")
      ->capture_default_str()->check(in_range(1, 256));
  app.add_option("--prefill-chunk", a->prefill_chunk,
                 "Prompt tokens per scheduler tick, in one forward pass (CPU: shared by the requests still prefilling)")
      ->capture_default_str()->check(in_range(1, 1 << 16));
  app.add_option("--itl-target-ms", a->itl_target_ms, "Target inter-token latency while prompts prefill: a tick "
                 "prefills fewer than --prefill-chunk tokens (at least 32) when others decode, as the measured pass and "
                 "step times allow (0: always the whole chunk: first tokens sooner, later ones slower)")
      ->capture_default_str()->check(in_range(0.0, 3600e3));
  app.add_option("--drain-seconds", a->drain_seconds, "On SIGINT/SIGTERM: stop admitting (503 with Retry-After, /health "
                 "503) and give running requests up to this long to finish, streams with data: [DONE]; a second "
                 "signal stops at once (0: stop at once, cutting streams)")
      ->capture_default_str()->check(in_range(0.0, 86400.0));
  app.add_flag("--sync-conversion", a->sync_conversion,
               "Wait for page conversion after every step, so compressed formats give the same tokens whatever the "
               "timing (tests; slower)");
  run_fn = [a] { return run(*a); };
}

}  // namespace activekv::cli
