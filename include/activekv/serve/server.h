// `activekv serve`: an OpenAI-compatible HTTP server over the CPU path or
// the GPU runtime (docs/serve.md). Endpoints: POST /v1/completions, POST /v1/chat/completions
// (stream: true as server-sent events ending in `data: [DONE]`), GET
// /v1/models, GET /health (503 while the model loads, then 200), GET /metrics
// (Prometheus text, names prefixed `activekv:`). Errors in OpenAI's shape
// {"error": {"message", "type", "param", "code"}} with the HTTP status.
#pragma once

#include <cstdint>
#include <string>

namespace activekv::serve {

struct ServeOptions {
  std::string model_path;           ///< GGUF file
  std::string model_name;           ///< the id clients name; empty: the file name without .gguf
  std::string host = "127.0.0.1";
  int port = 8080;                  ///< 0: any free port (printed)
  std::string api_key;              ///< non-empty: /v1/* need "Authorization: Bearer <key>"
  std::string device = "cpu";       ///< cpu, or cuda (the GPU runtime; CUDA builds)
  int threads = 1;                  ///< OpenMP and OpenBLAS threads of the model
  int64_t n_ctx = 0;                ///< tokens a request may hold (prompt + max_tokens); 0: the model's context
  int max_seqs = 8;                 ///< requests decoded at once
  int max_queue = 64;               ///< requests waiting; past it, 429
  double host_kv_mem_gib = 0;       ///< host memory for all running histories; 0: half of MemAvailable at start
  std::string kv_format = "bf16";   ///< bf16, f32, lossless13, int8s, hybrid
  int page_size = 1024;
  int recent_pages = 2;
  int tile_pages = 32;
  int convert_threads = 1;
  int prefill_chunk = 256;
  std::string kv_placement = "auto";  ///< cuda: host, gpu or auto (route::parse_placement)
  double gpu_kv_mem_gib = 0;        ///< cuda: GPU memory all histories share (each request gets 1/max_seqs); 0: free less a margin
  bool sync_conversion = false;     ///< wait for page conversion every step (deterministic compressed reads; tests)
  /// Target inter-token latency (seconds) while prompts prefill: ticks prefill
  /// fewer than prefill_chunk tokens when others decode (src/serve/prefill_budget.h); 0: off.
  double itl_target_s = 0;
  int http_threads = 0;             ///< HTTP worker threads; 0: max(256, max_seqs + max_queue + 8)
  /// Seconds the first SIGINT/SIGTERM gives the requests in flight to finish
  /// (new ones get 503 with Retry-After, /health 503); 0: stop at once,
  /// cutting streams without `data: [DONE]`. A second signal stops at once.
  double drain_seconds = 5;
};

/// Blocks SIGINT and SIGTERM in the calling thread, so that every thread it
/// starts afterwards -- the CUDA driver's (a GPU probe, the GPU runtime),
/// OpenMP's, the server's -- inherits the mask and run_server's one waiting
/// thread receives them. Call it before anything starts a thread: a thread
/// that leaves them unblocked takes SIGTERM's default action and kills the
/// process instead of stopping the server (the H200 at a071632: after
/// `--device auto` probed the GPU, every server exited non-zero when told to
/// stop; with --device cpu, no probe, they exited 0).
void block_stop_signals();

/// Binds host:port (printing "activekv serve: listening on http://HOST:PORT"
/// to stderr), loads the model while /health answers 503, then serves until
/// SIGINT or SIGTERM, draining first (ServeOptions::drain_seconds). Returns
/// the exit code. Throws Error for a port that cannot be bound and for a
/// model that cannot be loaded.
int run_server(const ServeOptions& o);

}  // namespace activekv::serve
