// See cpu_session.h.
#include "cpu_session.h"

#include <fmt/format.h>

namespace activekv::cli {

CpuSession::CpuSession(model::LlamaModel& lm, const CpuHistoryOptions& o, int64_t n_ctx,
                       const model::SamplerParams& sampling)
    : lm_(lm), history_(lm, o, n_ctx), sampler_(sampling), logits_(size_t(lm.config().vocab_size)) {}

void CpuSession::prefill(std::span<const int32_t> tokens, const model::ProgressFn& progress) {
  logits_ = lm_.prefill(tokens, history_.seq(), progress, &history_.view());
}

void CpuSession::step(int32_t token) {
  const int32_t one[1] = {token};
  lm_.forward(one, history_.seq(), logits_, false, &history_.view());
  history_.schedule();
}

void CpuSession::step_batch(model::LlamaModel& lm, std::span<CpuSession* const> sessions,
                            std::span<const int32_t> tokens) {
  if (sessions.size() != tokens.size())
    throw InvalidArgument(fmt::format("step_batch: {} sessions but {} tokens", sessions.size(), tokens.size()));
  std::vector<std::span<const int32_t>> pieces;
  for (size_t i = 0; i < tokens.size(); ++i) pieces.push_back(tokens.subspan(i, 1));
  append_batch(lm, sessions, pieces);
}

void CpuSession::append_batch(model::LlamaModel& lm, std::span<CpuSession* const> sessions,
                              std::span<const std::span<const int32_t>> pieces) {
  if (sessions.size() != pieces.size())
    throw InvalidArgument(fmt::format("append_batch: {} sessions but {} pieces", sessions.size(), pieces.size()));
  if (sessions.empty()) return;
  std::vector<model::BatchItem> items(sessions.size());
  for (size_t i = 0; i < sessions.size(); ++i)
    items[i] = {pieces[i], &sessions[i]->history_.seq(), &sessions[i]->history_.view()};
  const size_t vocab = size_t(lm.config().vocab_size);
  std::vector<float> logits(sessions.size() * vocab);
  lm.forward_batch(items, logits);  // commits every session's rows
  for (size_t i = 0; i < sessions.size(); ++i) std::copy_n(logits.data() + i * vocab, vocab, sessions[i]->logits_.data());
  // Every session has kept its rows: a failure scheduling one's conversions
  // must not throw from here (the scheduler would retry the batch, appending
  // the others' rows twice). Its pages then stay exact (a conversion that failed to
  // start is not retried: CompressedHistory::schedule); the route reads them exact.
  for (CpuSession* s : sessions) {
    try {
      s->history_.schedule();
    } catch (const std::exception&) {
    }
  }
}

}  // namespace activekv::cli
