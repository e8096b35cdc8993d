// One sequence being generated on the CPU: its history (cpu_history.h), its
// sampler and the logits of its last position. The decode loop of
// `activekv generate --device cpu` and each request of `activekv serve` are
// this type, so a served request computes exactly what generate computes.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "activekv/model/llama_model.h"
#include "activekv/model/sampler.h"
#include "cpu_history.h"

namespace activekv::cli {

/// Not movable (its history is not). Not thread-safe; the model it runs on is
/// shared with other sessions, so all of them must be driven from one thread.
class CpuSession {
 public:
  /// A history of n_ctx tokens in `o`'s format. Throws as CpuHistory and
  /// model::Sampler (bad sampling parameters).
  CpuSession(model::LlamaModel& lm, const CpuHistoryOptions& o, int64_t n_ctx, const model::SamplerParams& sampling);

  /// Appends `tokens` (one forward pass of at most the model's prefill_chunk
  /// each; pages that fill up are queued for conversion) and keeps the last
  /// position's logits. `progress` as model::LlamaModel::prefill.
  void prefill(std::span<const int32_t> tokens, const model::ProgressFn& progress = {});
  /// The next token, sampled from the last position's logits.
  int32_t sample() { return sampler_.sample(logits_); }
  /// Appends `token` (one decode step) and keeps its logits.
  void step(int32_t token);
  /// One decode step of several sessions on the same model in one batched
  /// forward pass (model::LlamaModel::forward_batch): sessions[i] appends
  /// tokens[i]. Each session's history is read and written alone.
  static void step_batch(model::LlamaModel& lm, std::span<CpuSession* const> sessions,
                         std::span<const int32_t> tokens);
  /// Several sessions append a piece each in one forward pass: sessions[i]
  /// appends pieces[i] (any length >= 1; a prompt's piece or one token) and
  /// keeps the logits of its piece's last position; pages that fill up are
  /// queued for conversion. The weights are read once for all of them, which
  /// is what a tick with several short prompts to prefill needs. Throws as
  /// forward_batch (every session unchanged), InvalidArgument when the counts differ.
  static void append_batch(model::LlamaModel& lm, std::span<CpuSession* const> sessions,
                           std::span<const std::span<const int32_t>> pieces);
  /// Blocks until background conversion has published every full page
  /// (compressed formats), so the next step reads them compressed.
  void wait_conversions() { history_.wait(); }

  /// The last position's logits [vocab].
  std::span<const float> logits() const { return logits_; }
  CpuHistory& history() { return history_; }
  int64_t n_tokens() const { return history_.seq().n_tokens(); }

 private:
  model::LlamaModel& lm_;
  CpuHistory history_;
  model::Sampler sampler_;
  std::vector<float> logits_;  // [vocab]: the last position's
};

}  // namespace activekv::cli
