// Where the scheduler's requests run: the CPU path (cpu_backend.cpp: one
// LlamaModel, a cli::CpuSession per request) or the GPU runtime
// (gpu_backend.cpp, CUDA builds: one runtime::GpuModel, a GpuSequence per
// request). The scheduler (scheduler.h) is the same for both: it opens a
// Session per admitted request, prefills prompts a chunk of tokens per tick
// (one request's, or several requests' pieces in one pass where the backend
// batches prefill), samples, and advances the decoding ones together with step_batch.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "activekv/core/error.h"
#include "activekv/gguf/gguf.h"
#include "activekv/model/config.h"
#include "activekv/model/sampler.h"
#include "cpu_history.h"

namespace activekv::serve {

/// One request's history and sampler. Driven from the scheduler's thread only.
class Session {
 public:
  virtual ~Session() = default;
  /// Appends a piece of the prompt (at most the backend's prefill_chunk
  /// tokens); `last`: the prompt's final piece (sample() then gives the first token).
  /// Returns when the piece's work is done, not merely queued: the
  /// scheduler times it for the ITL budget (prefill_budget.h). The GPU
  /// session's GpuSequence::append and prefill end in HistoryView::prefill_done,
  /// which synchronises the stream.
  virtual void prefill(std::span<const int32_t> piece, bool last) = 0;
  /// The next token, sampled from the last position: once after the prompt's
  /// last piece and once after every step.
  virtual int32_t sample() = 0;
  /// Appends `token` alone (one decode step; the scheduler's retry when a batched step throws).
  virtual void step(int32_t token) = 0;
  /// Blocks until background conversion has published every full page.
  virtual void wait_conversions() = 0;
  /// History bytes its decode steps read since the last call.
  virtual uint64_t take_bytes_read() = 0;
  /// GPU bytes its history holds (its share of the GPU budget); 0 on the CPU.
  virtual uint64_t gpu_bytes() const { return 0; }
};

/// One session's piece of prompt in a tick's prefill (Backend::prefill_batch).
struct PrefillPiece {
  Session* session = nullptr;
  std::span<const int32_t> tokens;
  bool last = false;  ///< the prompt's final piece
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const model::ModelConfig& config() const = 0;
  /// One line for the startup message, e.g. "cpu, bf16 history" or "cuda (NVIDIA H200), ...".
  virtual std::string describe() const = 0;
  /// Prompt tokens per scheduler tick: one request's piece, or, where
  /// batches_prefill(), the pieces of several in one pass.
  virtual int prefill_chunk() const = 0;
  /// Whether prefill_batch runs several sessions' pieces in one forward pass
  /// (the CPU path). If not, the scheduler prefills one session per tick
  /// through Session::prefill, as a pass there already holds a whole chunk.
  virtual bool batches_prefill() const { return false; }
  /// The pieces (distinct sessions, at most prefill_chunk() tokens in all) in
  /// one forward pass: the weights are read once for all of them. On a throw
  /// every session is unchanged (the scheduler then retries them one at a
  /// time). Only called when batches_prefill().
  virtual void prefill_batch(std::span<const PrefillPiece> /*pieces*/) {
    throw Error("serve: this backend prefills one session per tick (batches_prefill() is false)");
  }
  /// Most sessions one step_batch call takes.
  virtual int max_batch() const = 0;
  /// Host bytes of a history of n_ctx tokens (the scheduler's host KV budget).
  virtual uint64_t history_bytes(int64_t n_ctx) const = 0;
  /// A session of n_ctx tokens. Throws (this request alone fails): memory,
  /// a GPU budget that does not fit, bad sampling parameters.
  virtual std::unique_ptr<Session> open(int64_t n_ctx, const model::SamplerParams& sampling) = 0;
  /// One decode step: sessions[i] (this backend's, distinct, at most
  /// max_batch()) appends tokens[i], all in one batched forward pass.
  virtual void step_batch(std::span<Session* const> sessions, std::span<const int32_t> tokens) = 0;
  /// Why no request can run any more ("" while they can), asked after a
  /// request failed: the GPU backend's CUDA context hit a sticky error (an
  /// illegal address: every later call fails) or its model lost its
  /// buffers. The scheduler then fails every request and stops the server.
  virtual std::string broken() { return ""; }
};

struct BackendOptions {
  std::string device = "cpu";       ///< cpu or cuda
  int prefill_chunk = 256;
  cli::CpuHistoryOptions history;   ///< format (cuda: bf16 = the exact route), pages, conversion threads
  // cuda only:
  std::string kv_placement = "auto";  ///< host, gpu, auto (route::parse_placement)
  uint64_t gpu_kv_mem = 0;          ///< GPU bytes all histories share; 0 = free memory less a margin
  int max_seqs = 8;                 ///< each request's GPU budget is gpu_kv_mem / max_seqs
};

/// Loads the model for o.device. Throws Error: cuda in a build without the
/// GPU runtime, no GPU, weights that do not fit, f32 history on the GPU.
std::unique_ptr<Backend> make_backend(const gguf::File& file, const std::string& model_path, const BackendOptions& o);

std::unique_ptr<Backend> make_cpu_backend(const gguf::File& file, const std::string& model_path,
                                          const BackendOptions& o);
#ifdef ACTIVEKV_SERVE_GPU
std::unique_ptr<Backend> make_gpu_backend(const gguf::File& file, const BackendOptions& o);
#endif

}  // namespace activekv::serve
