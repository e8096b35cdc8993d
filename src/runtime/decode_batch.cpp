// GpuModel::decode_batch: one decode step of several sequences in one forward
// pass. See activekv/runtime/gpu_model.h.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <exception>
#include <vector>

#include "activekv/runtime/gpu_model.h"
#include "activekv/runtime/gpu_sequence.h"
#include "sequence_state.h"

namespace activekv::runtime {
std::vector<int32_t> GpuModel::decode_batch(std::span<GpuSequence* const> seqs, std::span<const int32_t> tokens) {
  Impl& M = *impl_;
  const int N = int(seqs.size());
  if (N < 1 || N > GpuForward::kMatvecRows)
    throw InvalidArgument(fmt::format("decode_batch: {} sequences; one step takes 1..{}", N, GpuForward::kMatvecRows));
  if (tokens.size() != seqs.size())
    throw InvalidArgument(fmt::format("decode_batch: {} sequences but {} tokens", N, tokens.size()));
  // Fixed-size: no allocation on the decode path but the returned tokens.
  std::array<GpuSequence::Impl*, GpuForward::kMatvecRows> S{};
  for (int i = 0; i < N; ++i) {
    if (!seqs[size_t(i)]) throw InvalidArgument(fmt::format("decode_batch: sequence {} is null", i));
    GpuSequence::Impl& I = *seqs[size_t(i)]->impl_;
    if (&I.m != &M) throw InvalidArgument(fmt::format("decode_batch: sequence {} belongs to another model", i));
    for (int j = 0; j < i; ++j)
      if (S[size_t(j)] == &I) throw InvalidArgument(fmt::format("decode_batch: sequence {} appears twice", i));
    if (I.deferred_error) std::rethrow_exception(I.deferred_error);  // it alone fails (its solo retry throws too)
    I.check_tokens(tokens.subspan(size_t(i), 1));
    S[size_t(i)] = &I;
  }
  // A solo decode's lookahead step (of a sequence here or not): it ran before
  // this batch, whose logits and sampled ids must be the latest, and fit_rows
  // may reallocate the logits it wrote.
  if (M.ahead_owner) M.ahead_owner->discard_ahead();
  if (!M.fit_rows(N, N)) throw Error(fmt::format("the GPU has not the memory for a decode batch of {} rows", N));

  // Until the step is kept, a throw gives back each sequence's sampler draw
  // and stops its next step reusing the device's sampled id (this failed
  // step may have written it): the scheduler's solo retry then samples as if
  // the batch had never run (found by a review, session 23).
  struct Undo {
    std::array<GpuSequence::Impl*, GpuForward::kMatvecRows>& seqs;
    int n;
    std::array<uint64_t, GpuForward::kMatvecRows> draws{};
    bool kept = false;
    ~Undo() {
      if (kept) return;
      for (int i = 0; i < n; ++i) {
        GpuSequence::Impl& I = *seqs[size_t(i)];
        I.sampled_valid = false;
        try {
          I.sampler->rewind(draws[size_t(i)]);
        } catch (const std::exception&) {  // not past the draws made: cannot happen
        }
      }
    }
  } undo{S, N};
  for (int i = 0; i < N; ++i) undo.draws[size_t(i)] = S[size_t(i)]->sampler->draws();

  // Per sequence, as a lone decode step prepares it: its pages, its token
  // id (row i), its position, its engine's tables -- all on the one stream.
  const cudaStream_t s = M.stream;
  std::array<int64_t, GpuForward::kMatvecRows> pos0{};
  for (int i = 0; i < N; ++i) {
    GpuSequence::Impl& I = *S[size_t(i)];
    pos0[size_t(i)] = I.seq->n_tokens();
    I.seq->reserve(1);
    I.history->prepare(pos0[size_t(i)], 1, /*prefill=*/false, s);
    I.stage_decode_token(tokens[size_t(i)], M.batch_ids + i, s);
    M.host_pos[i] = pos0[size_t(i)];
  }
  cuda::check_cuda(cudaMemcpyAsync(M.batch_pos, M.host_pos, size_t(N) * sizeof(int64_t), cudaMemcpyHostToDevice, s),
                   "upload the batch's positions");
  // Attention: one engine for the whole batch when the sequences can share
  // one (each layer one launch per kernel over every sequence's page tables,
  // one merge), else each sequence's own. The same kernels read the same
  // pages at the same split boundaries either way: the same bits.
  cuda::DecodeEngine* shared = nullptr;
  if (N >= 2 && std::all_of(S.begin() + 1, S.begin() + N, [&](const GpuSequence::Impl* I) {
        return cuda::same_engine_config(I->engine->config(), S[0]->engine->config());
      })) {
    if (!M.batch_engine || !cuda::same_engine_config(M.batch_engine->config(), S[0]->engine->config())) {
      M.batch_engine.reset();  // waits for its streams
      M.batch_engine = std::make_unique<cuda::DecodeEngine>(S[0]->engine->config());
    }
    shared = M.batch_engine.get();
  }
  if (shared) {
    M.batch_tables.resize(size_t(N));
    for (int i = 0; i < N; ++i) {  // a batch step commits as it is enqueued: its figures count now
      RouteCounts counts;
      M.batch_tables[size_t(i)] = std::move(S[size_t(i)]->history->engine_tables(pos0[size_t(i)] + 1, s, counts)[0]);
      counts.add_to(S[size_t(i)]->stats);
    }
    shared->update(M.batch_tables);
    shared->begin_step();
  } else {
    for (int i = 0; i < N; ++i) {
      GpuSequence::Impl& I = *S[size_t(i)];
      RouteCounts counts;
      I.engine->update(I.history->engine_tables(pos0[size_t(i)] + 1, s, counts));
      counts.add_to(I.stats);
      I.engine->begin_step();
    }
  }

  // The N rows share every projection (the weights read once); the rows'
  // queries are [N][n_heads][head_dim], the batch engine's query layout.
  const size_t qd = size_t(M.c.n_heads) * size_t(M.c.head_dim), kvd = size_t(M.c.n_kv_heads) * size_t(M.c.head_dim);
  // The rows' K/V in one launch per layer when their pages share a layout
  // (they do for one model's sequences), else one per sequence: the same
  // bytes either way.
  static_assert(cuda::kMaxKvSlots >= GpuForward::kMatvecRows);
  const cuda::AttnShape& a0 = S[0]->history->attn_shape();
  const bool one_write = std::all_of(S.begin(), S.begin() + N, [&](const GpuSequence::Impl* I) {
    const cuda::AttnShape& a = I->history->attn_shape();
    return a.page_size == a0.page_size && a.n_kv_heads == a0.n_kv_heads && a.head_dim == a0.head_dim;
  });
  std::array<cuda::KvSlot, GpuForward::kMatvecRows> slots{};
  const LayerAttention attend = [&](int l, int, const float* q, const float* k, const float* v, float* out,
                                    cuda::Int8Blocks out_int8) {
    if (one_write) {
      for (int i = 0; i < N; ++i) slots[size_t(i)] = S[size_t(i)]->history->kv_slot(l, pos0[size_t(i)]);
      cuda::launch_write_kv_slots(a0, k, v, int64_t(kvd), slots.data(), N, s);
    } else {
      for (int i = 0; i < N; ++i)
        S[size_t(i)]->history->write_kv(l, pos0[size_t(i)], 1, k + size_t(i) * kvd, v + size_t(i) * kvd, s);
    }
    if (shared) {
      shared->enqueue_layer(l, q, out, nullptr, out_int8);
      return out_int8.codes != nullptr;
    }
    for (int i = 0; i < N; ++i)
      S[size_t(i)]->engine->enqueue_layer(l, q + size_t(i) * qd, out + size_t(i) * qd, nullptr,
                                          out_int8.from_row(i, qd));
    return out_int8.codes != nullptr;
  };
  M.forward->run(M.batch_ids, M.batch_pos, N, attend, /*all_logits=*/true, s);
  ++M.runs;
  for (int i = 0; i < N; ++i) {
    GpuSequence::Impl& I = *S[size_t(i)];
    I.enqueue_sample(M.forward->logits() + size_t(i) * size_t(M.c.vocab_size));
    I.ran(i);
    // Its own engine ran this step eagerly (a later graph capture finds it initialised) only without the batch engine.
    if (!shared) I.decoded_eagerly = true;
  }
  std::vector<int32_t> next(static_cast<size_t>(N));
  for (int i = 0; i < N; ++i) next[size_t(i)] = S[size_t(i)]->fetch_sampled();  // the first waits for the whole step
  // A CPU task's failure made the step NaN: throw before any sequence keeps it.
  if (shared) {
    shared->check_cpu_error();
  } else {
    for (int i = 0; i < N; ++i) S[size_t(i)]->engine->check_cpu_error();
  }
  undo.kept = true;
  for (int i = 0; i < N; ++i) {
    GpuSequence::Impl& I = *S[size_t(i)];
    I.seq->commit(1);
    I.count_decode_step(shared ? shared->sequence_figures(size_t(i)) : I.engine->sequence_figures(0));
    I.stats.batched_attention_steps += shared != nullptr;
  }
  // Every sequence has kept the step: a failure scheduling one's conversions
  // must not throw from here (the scheduler would retry a step the others
  // kept, appending their tokens twice). It fails that sequence's next step.
  for (int i = 0; i < N; ++i) {
    try {
      S[size_t(i)]->history->committed();
    } catch (const std::exception&) {
      S[size_t(i)]->deferred_error = std::current_exception();
    }
  }
  return next;
}

}  // namespace activekv::runtime
