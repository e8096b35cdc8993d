// One history on a GpuModel. See activekv/runtime/gpu_sequence.h (and
// gpu_runtime.h for the data flow).
#include "activekv/runtime/gpu_sequence.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <thread>

#include "activekv/cuda/device_pages.h"
#include "activekv/cuda/pinned_memory.h"
#include "activekv/route/placement.h"
#include "device_buffer.h"
#include "sequence_state.h"

namespace activekv::runtime {

GpuSequence::Impl::Impl(GpuModel& model, const RuntimeOptions& o)
    : owner(model), m(*model.impl_), c(m.c), opt(o) {
  try {
    build();
  } catch (...) {
    release();  // a refused sequence leaves nothing behind: the others keep the GPU
    throw;
  }
  m.kv_reserved += reserved;
  ++m.open;
}

void GpuSequence::Impl::build() {
  if (opt.device != m.opt.device || opt.f32_activations != m.opt.f32_activations || opt.observer)
    throw InvalidArgument("GpuSequence: device, f32_activations and observer are the model's (ModelOptions)");
  check_sequence_options(opt, bool(m.opt.observer));
  stats.device = m.device;
  stats.weight_bytes = m.weights->bytes();
  attn = sequence_attn_shape(c, opt);
  // The store holds the global layers only; the sliding ones live in GPU rings.
  kv_shape = kv::KvShape{c.n_global_layers(), c.n_kv_heads, c.head_dim, opt.page_size, kv::PageFormat::bf16};
  pages_per_layer = (opt.n_ctx + opt.page_size - 1) / opt.page_size;
  const size_t cap = m.budget_cap(opt.gpu_kv_mem);  // throws, one line, when the asked budget does not fit

  engine = std::make_unique<cuda::DecodeEngine>(sequence_engine_config(c, opt, attn, m.stream));
  prefill_attn = std::make_unique<cuda::PrefillAttention>(attn);
  sampler = std::make_unique<cuda::GpuSampler>(c.vocab_size, opt.sampling);
  rows_cap = std::max(opt.prefill_chunk, opt.stream_chunk > 0 ? opt.stream_chunk : route::kMaxStreamChunk);
  ids = cuda::device_alloc<int32_t>(size_t(rows_cap), "GpuRuntime: token ids");
  pos = upload_positions(opt.n_ctx, "GpuRuntime");
  sampled = cuda::device_alloc<int32_t>(1, "GpuRuntime: the sampled token");
  void* h = nullptr;
  cuda::check_cuda(cudaHostAlloc(&h, size_t(rows_cap + 2) * sizeof(int32_t), cudaHostAllocPortable),
                   "cudaHostAlloc (token ids)");
  host_ids = static_cast<int32_t*>(h);
  cuda::check_cuda(cudaEventCreateWithFlags(&token_ready, cudaEventDisableTiming), "cudaEventCreate");
  for (cudaEvent_t& e : slot_ready)
    cuda::check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");

  // The page store, pinned, sized for the context; then the placement within the budget.
  store = std::make_unique<kv::PageStore>(kv_shape, size_t(pages_per_layer) * size_t(kv_shape.n_layers),
                                          &cuda::pinned_host_memory());
  seq = std::make_unique<kv::SequenceKv>(*store);
  history = std::make_unique<HistoryView>(*seq, layer_windows(c), rows_cap, attn, opt, stats, cap);
  if (opt.cuda_graphs && stats.placement.placement == route::KvPlacement::gpu) graph = std::make_unique<StepGraph>();
  // Lookahead needs the graphs (only graphed steps look ahead) and a second
  // logits row, so that the step ahead leaves the last step's logits alone.
  const char* env = std::getenv("ACTIVEKV_LOOKAHEAD");
  lookahead = opt.lookahead && graph && forward().max_rows() >= 2 && !(env && std::string(env) == "0");
  // gpu placement holds its history; the others may fill the budget (a resident prompt, partial's pools).
  reserved = stats.placement.placement == route::KvPlacement::gpu
                 ? std::min(stats.placement.history_bytes, history->budget())
                 : history->budget();
}

GpuSequence::Impl::~Impl() { release(); }

void GpuSequence::Impl::release() {
  // A destructor's path: an error of an abandoned step is dropped (a step
  // that was kept reported its own), and the batch engine, which may hold
  // this sequence's pages in a failed step's queued CPU task, is drained too.
  const auto drain = [](cuda::DecodeEngine* e) {
    try {
      if (e) e->synchronize();
    } catch (const std::exception&) {
    }
  };
  drain(engine.get());
  drain(m.batch_engine.get());
  if (ahead) {
    cudaStreamSynchronize(stream());  // a lookahead step may still use the buffers freed below
    if (m.ahead_owner == this) m.ahead_owner = nullptr;
  }
  history.reset();  // cancels conversions before the sequence frees its pages
  seq.reset();
  cudaFree(ids);
  cudaFree(pos);
  cudaFree(sampled);
  if (host_ids) cudaFreeHost(host_ids);
  if (token_ready) cudaEventDestroy(token_ready);
  for (cudaEvent_t& e : slot_ready) {
    if (e) cudaEventDestroy(e);
    e = nullptr;
  }
  ids = nullptr;
  pos = nullptr;
  sampled = nullptr;
  host_ids = nullptr;
  token_ready = nullptr;
}

void GpuSequence::Impl::check_tokens(std::span<const int32_t> tokens) const {
  check_sequence_tokens(c, tokens, seq->n_tokens(), opt.n_ctx);
}

void GpuSequence::Impl::stage_decode_token(int32_t token, int32_t* dst, cudaStream_t s) {
  if (sampled_valid && token == last_sampled) {
    cuda::check_cuda(cudaMemcpyAsync(dst, sampled, sizeof(int32_t), cudaMemcpyDeviceToDevice, s), "token id");
    return;
  }
  host_ids[0] = token;
  cuda::check_cuda(cudaMemcpyAsync(dst, host_ids, sizeof(int32_t), cudaMemcpyHostToDevice, s), "upload a token id");
}

// Enqueues the sampling from one row of logits and the copy of the token id
// to pinned host memory (capturable: no synchronisation).
void GpuSequence::Impl::enqueue_sample(const float* logits_row, int slot) {
  const cudaStream_t s = stream();
  sampler->sample(logits_row, sampled, s);
  cuda::check_cuda(cudaMemcpyAsync(host_ids + rows_cap + slot, sampled, sizeof(int32_t), cudaMemcpyDeviceToHost, s),
                   "download the sampled token");
}

// Waits for the step and reads the token id enqueue_sample copied: the one
// host synchronisation of a step (a batch's first call waits for all of it).
int32_t GpuSequence::Impl::fetch_sampled() {
  wait_step();
  last_sampled = host_ids[rows_cap];
  sampled_valid = true;
  return last_sampled;
}

int32_t GpuSequence::Impl::fetch_slot(int slot) {
  cuda::check_cuda(cudaEventSynchronize(slot_ready[slot]), "waiting for the step");
  last_sampled = host_ids[rows_cap + slot];
  sampled_valid = true;
  return last_sampled;
}

void GpuSequence::Impl::wait_step() {
  cuda::check_cuda(cudaEventRecord(token_ready, stream()), "cudaEventRecord");
  cuda::check_cuda(cudaEventSynchronize(token_ready), "waiting for the step");
}

void GpuSequence::Impl::count_decode_step(const cuda::DecodeEngine::SeqFigures& f) {
  stats.streamed_bytes += f.streamed;
  stats.resident_bytes += f.resident;
  stats.cpu_bytes += f.cpu;
  stats.sliding_bytes += f.windowed_resident;
  stats.copies += f.copies;
  ++stats.decode_steps;
}

// Whether this step runs as a graph: a decode step with graphs on (gpu
// placement), after one eager decode step, and -- a guard, gpu placement
// reads every page in place -- with no host -> device copies in the engine's
// step (those wait on events of the copy stream: not captured).
bool GpuSequence::Impl::graph_step(bool decode) const {
  return decode && graph && decoded_eagerly && engine->copies_per_step() == 0;
}

// Runs one chunk of rows through the model (a decode step: one row through
// the engine; prefill: rows attending over device copies of the history),
// commits it to the history and samples.
int32_t GpuSequence::Impl::run_chunk(std::span<const int32_t> tokens, bool prefill, bool all_logits, bool sample) {
  return finish_chunk(enqueue_chunk(tokens, seq->n_tokens(), prefill, all_logits, sample, 0, 0));
}

// Enqueues a chunk up to its sampled id's copy home. With graphs
// (graph_step), what reads host state that changes -- device page copies,
// page-table and work-list patches, the token id's upload -- is enqueued
// first, eagerly; the forward pass and the sampler are captured and launched
// as one graph. Nothing here waits for the GPU, so a lookahead step can be
// enqueued behind the running one: every host buffer the GPU reads later is
// a PatchBuffer's (double-buffered) or a captured kernel argument.
GpuSequence::Impl::Step GpuSequence::Impl::enqueue_chunk(std::span<const int32_t> tokens, int64_t pos0, bool prefill,
                                                         bool all_logits, bool sample, int slot, int logits_row) {
  if (m.ahead_owner && m.ahead_owner != this) m.ahead_owner->discard_ahead();  // its step ran before this one
  Step st;
  st.pos = pos0;
  st.T = tokens.empty() ? 1 : int(tokens.size());
  st.decode = !prefill;
  st.sample = sample;
  st.slot = slot;
  st.logits_row = logits_row;
  st.logits_rows = all_logits ? st.T : 1;
  st.draws_before = sampler->draws();
  const int T = st.T;
  const cudaStream_t s = stream();
  const auto t_enqueue = std::chrono::steady_clock::now();
  seq->reserve(pos0 + T - seq->n_tokens());  // may throw (store full): nothing written yet
  history->prepare(pos0, T, prefill, s);  // device copies and published pages the rows need
  if (tokens.empty()) {  // lookahead: the token the step before samples, on the GPU
    cuda::check_cuda(cudaMemcpyAsync(ids, sampled, sizeof(int32_t), cudaMemcpyDeviceToDevice, s), "token id");
  } else if (st.decode) {
    stage_decode_token(tokens[0], ids, s);
  } else {
    std::copy(tokens.begin(), tokens.end(), host_ids);
    cuda::check_cuda(cudaMemcpyAsync(ids, host_ids, size_t(T) * sizeof(int32_t), cudaMemcpyHostToDevice, s),
                     "upload token ids");
  }
  if (st.decode) {
    // The tables' route figures count when the step commits (finish_chunk),
    // which a lookahead step may never do.
    st.route_version = history->route_version();  // read first: a publication while building makes it stale
    engine->update(history->engine_tables(pos0 + 1, s, st.route));
    engine->begin_step();
  }
  const LayerAttention attend = [&](int l, int rows, const float* q, const float* k, const float* v, float* out,
                                    cuda::Int8Blocks out_int8) {
    history->write_kv(l, pos0, rows, k, v, s);
    if (st.decode) {
      engine->enqueue_layer(l, q, out, nullptr, out_int8);
      return out_int8.codes != nullptr;
    }
    history->prefill_attention(l, pos0, rows, q, out, *prefill_attn, s);
    return false;
  };
  GpuForward& fw = forward();
  const auto enqueue = [&] {  // from the token id on the GPU to the sampled id in pinned memory
    fw.run(ids, pos + pos0, T, attend, all_logits, s, logits_row);
    if (sample) enqueue_sample(fw.logits() + size_t(logits_row + st.logits_rows - 1) * size_t(c.vocab_size), slot);
  };
  st.graph = graph_step(st.decode);
  if (st.graph) {
    graph->capture(s, enqueue);
    graph->launch(s);
    stats.graph_instantiations = graph->instantiations();
  } else {
    enqueue();
    decoded_eagerly = decoded_eagerly || st.decode;
  }
  if (sample) cuda::check_cuda(cudaEventRecord(slot_ready[slot], s), "cudaEventRecord");
  st.run = ++m.runs;
  if (st.decode) st.figures = engine->sequence_figures(0);
  st.enqueue_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_enqueue).count();
  return st;
}

// Waits for an enqueued chunk, commits it and counts it.
int32_t GpuSequence::Impl::finish_chunk(const Step& st) {
  int32_t next = -1;
  if (st.sample) {
    next = fetch_slot(st.slot);
  } else {
    wait_step();  // the K/V are in the host pages before conversion may read them
  }
  engine->check_cpu_error();  // a CPU task's failure made this step NaN: not committed
  // Its logits are this sequence's last unless another run came after it
  // (this sequence's own lookahead step writes the other row: allowed).
  last_row = st.logits_row + st.logits_rows - 1;
  last_run = st.run == m.runs || (ahead && ahead->run == m.runs && st.run + 1 == m.runs) ? st.run : 0;
  seq->commit(st.T);
  if (st.decode) {
    stats.decode_enqueue_s += st.enqueue_s;
    stats.graph_steps += st.graph;
    count_decode_step(st.figures);
    st.route.add_to(stats);
    if (history->learns_cpu_rate()) {  // --cpu-share auto: the next plans price the CPU as it ran
      history->observe_cpu(engine->cpu_timing());
      engine->reset_cpu_timing();
    }
  }
  history->committed();  // schedules conversion of pages that became full
  return next;
}

// A decode step. With lookahead, the step after it is enqueued before this
// one's token is read back, fed that token on the GPU: the host captures
// step n+1 while the GPU runs step n. The next call finds it enqueued when
// its token is the one sampled (a generation loop's case), else discards it
// and enqueues its own at the same position (stream order: its K/V row is
// written over, the discarded step's sampler draw given back).
int32_t GpuSequence::Impl::decode_step(int32_t token) {
  const int64_t pos0 = seq->n_tokens();
  std::optional<Step> cur;
  // Reused only if its token is the one asked for and no page was published
  // since its tables were built (the commit of the step before may have just
  // scheduled -- with synchronous conversion, done -- a page's conversion:
  // without lookahead this step's route would read it compressed).
  if (ahead && ahead->pos == pos0 && sampled_valid && token == last_sampled &&
      ahead->route_version == history->route_version()) {
    cur = ahead;
    ahead.reset();
    m.ahead_owner = nullptr;
    ++stats.lookahead_steps;
  } else {
    discard_ahead();
    const int row = lookahead ? int(pos0 & 1) : 0;
    cur = enqueue_chunk(std::span(&token, 1), pos0, false, false, true, int(pos0 & 1), row);
  }
  const bool ahead_failed =
      lookahead && cur->graph && pos0 + 2 <= opt.n_ctx && room_for(pos0 + 2) && !enqueue_ahead(*cur);
  const int32_t next = finish_chunk(*cur);
  if (ahead_failed) sampled_valid = false;  // the failed step may have sampled into `sampled`
  return next;
}

bool GpuSequence::Impl::enqueue_ahead(const Step& cur) {
  const uint64_t draws = sampler->draws();
  try {
    const int next = int((cur.pos + 1) & 1);
    ahead = enqueue_chunk({}, cur.pos + 1, false, false, true, next, next);
    m.ahead_owner = this;
    return true;
  } catch (const Error&) {
    // Only the step ahead failed (say, its tables need more splits than one
    // merge takes, one token past this step): this step goes on as without
    // lookahead, and so does every later one. The failed step's eager work
    // (a token copy, patches) is redone by the next step in stream order.
    sampler->rewind(draws);
    lookahead = false;
    return false;
  }
}

// Whether the page store can hold `end` tokens (reserving them): a full
// store refuses the lookahead step, not the step asked for.
bool GpuSequence::Impl::room_for(int64_t end) {
  try {
    seq->reserve(end - seq->n_tokens());
    return true;
  } catch (const Error&) {
    return false;
  }
}

void GpuSequence::Impl::discard_ahead() {
  if (!ahead) return;
  sampler->rewind(ahead->draws_before);
  sampled_valid = false;  // the device's sampled id is the discarded step's
  ++stats.lookahead_discarded;
  ahead.reset();
  if (m.ahead_owner == this) m.ahead_owner = nullptr;
}

// Where the prompt's history lives while it prefills, and the chunk: resident
// when it fits the budget; else streamed, with the chunk grown (bytes moved
// fall as 1 / chunk) as far as free memory lets the forward's buffers grow.
route::PrefillPlan GpuSequence::Impl::begin_prefill(int64_t n) {
  route::PrefillPlan plan = history->plan_prefill(n, opt.prefill_chunk, opt.prefill_chunk);
  if (plan.streamed) {
    int chunk = opt.stream_chunk;
    if (chunk <= 0) {
      // Keep the margin, and room for the history's pages at a larger chunk.
      const cuda::GpuMemory mem = cuda::gpu_memory();
      const size_t keep = route::gpu_margin_bytes(mem.total) + 2 * plan.device_bytes;
      chunk = route::choose_stream_chunk(opt.prefill_chunk, n, GpuForward::row_bytes(c),
                                         mem.free > keep ? mem.free - keep : 0);
    }
    plan = history->plan_prefill(n, opt.prefill_chunk, chunk);
    if (!m.fit_rows(plan.chunk, opt.prefill_chunk)) plan = history->plan_prefill(n, opt.prefill_chunk, opt.prefill_chunk);
  }
  if (!m.fit_rows(plan.chunk, opt.prefill_chunk))  // the model's buffers may be another sequence's size
    throw Error(fmt::format("the GPU has not the memory for a prefill chunk of {} tokens", plan.chunk));
  try {
    history->begin_prefill(plan, stream());
  } catch (const cuda::CudaError&) {
    if (plan.streamed) throw;
    // The budget said the prompt fits, the device memory is not there now: stream it.
    plan = history->plan_prefill(n, opt.prefill_chunk, opt.prefill_chunk, /*allow_resident=*/false);
    history->begin_prefill(plan, stream());
  }
  stats.prefill_streamed = plan.streamed;
  stats.prefill_chunk = plan.chunk;
  stats.prefill_staging_pages = plan.staging_pages;
  stats.prefill_moved_bytes = 0;
  return plan;
}

// Appends `tokens` through the prefill path in the plan's chunks. On an error
// the chunks already run stay in the history; the prompt's device pages are
// given back (best effort: a failed GPU may fail that too).
int32_t GpuSequence::Impl::prefill_all(std::span<const int32_t> tokens, bool all_logits, const ChunkFn& after_chunk,
                                       bool sample) {
  check_tokens(tokens);
  // Any sequence's step ahead: begin_prefill may grow (reallocate) the
  // model's buffers, its logits among them.
  if (m.ahead_owner) m.ahead_owner->discard_ahead();
  const route::PrefillPlan plan = begin_prefill(int64_t(tokens.size()));
  int32_t next = -1;
  try {
    for (size_t done = 0; done < tokens.size();) {
      const size_t n = std::min(tokens.size() - done, size_t(plan.chunk));
      // Every chunk samples when `sample` (GpuRuntime's behaviour: the sampler's
      // draw count is the number of chunks; the CPU path draws once per prompt).
      next = run_chunk(tokens.subspan(done, n), true, all_logits, sample);
      if (after_chunk) after_chunk(done, n);
      done += n;
    }
  } catch (...) {
    try {
      history->prefill_done(stream());
    } catch (const Error&) {
    }
    throw;
  }
  stats.prefill_moved_bytes = history->prefill_done(stream());
  return next;
}

GpuSequence::GpuSequence(GpuModel& model, const RuntimeOptions& opt)
    : impl_(std::make_unique<Impl>(model, opt)) {}

GpuSequence::~GpuSequence() {
  if (!impl_) return;
  GpuModel::Impl& m = impl_->m;
  const size_t reserved = impl_->reserved;
  impl_.reset();  // its pages first, then its share of the budget
  m.kv_reserved -= std::min(m.kv_reserved, reserved);
  --m.open;
}

int32_t GpuSequence::prefill(std::span<const int32_t> prompt, const ProgressFn& progress) {
  if (prompt.empty()) throw InvalidArgument("prefill: the prompt is empty");
  const int64_t total = int64_t(prompt.size());
  return impl_->prefill_all(prompt, false, [&](size_t done, size_t n) {
    if (progress) progress(int64_t(done + n), total);
  });
}

void GpuSequence::append(std::span<const int32_t> tokens) {
  if (tokens.empty()) throw InvalidArgument("append: no tokens");
  impl_->prefill_all(tokens, false, {}, /*sample=*/false);
}

int32_t GpuSequence::decode(int32_t token) {
  Impl& I = *impl_;
  if (I.deferred_error) std::rethrow_exception(I.deferred_error);  // a kept batch step's late failure
  const int32_t one[1] = {token};
  I.check_tokens(one);
  return I.decode_step(token);
}

std::vector<float> GpuSequence::prefill_logits(std::span<const int32_t> tokens) {
  Impl& I = *impl_;
  if (tokens.empty()) throw InvalidArgument("prefill_logits: no tokens");
  const size_t vocab = size_t(I.c.vocab_size);
  std::vector<float> out(tokens.size() * vocab);
  I.prefill_all(tokens, true, [&](size_t done, size_t n) {
    cuda::check_cuda(cudaMemcpy(out.data() + done * vocab, I.forward().logits(), n * vocab * sizeof(float),
                                cudaMemcpyDeviceToHost),
                     "download logits");
  });
  return out;
}

std::vector<float> GpuSequence::last_logits() const {
  const Impl& I = *impl_;
  std::vector<float> out(size_t(I.c.vocab_size));
  if (I.last_row < 0) throw InvalidArgument("last_logits: nothing was run yet");
  // A lookahead step of this sequence may have run since: it wrote the other row.
  const bool only_ahead_since = I.ahead && I.ahead->run == I.m.runs && I.last_run + 1 == I.m.runs;
  if (I.last_run != I.m.runs && !only_ahead_since)
    throw InvalidArgument("last_logits: another sequence ran on the model since (the logits buffer is shared)");
  cuda::check_cuda(cudaMemcpy(out.data(), I.forward().logits() + size_t(I.last_row) * out.size(),
                              out.size() * sizeof(float), cudaMemcpyDeviceToHost),
                   "download logits");
  return out;
}

void GpuSequence::wait_conversions() { impl_->history->wait_conversions(); }

int64_t GpuSequence::n_tokens() const { return impl_->seq->n_tokens(); }
int64_t GpuSequence::n_ctx() const { return impl_->opt.n_ctx; }
HostHistory GpuSequence::host_history() const {
  return {impl_->seq.get(), impl_->history->compressed(), impl_->history->store_layers()};
}
const model::ModelConfig& GpuSequence::config() const { return impl_->c; }
const RuntimeStats& GpuSequence::stats() const { return impl_->stats; }
size_t GpuSequence::kv_reserved() const { return impl_->reserved; }
const GpuModel& GpuSequence::model() const { return impl_->owner; }

}  // namespace activekv::runtime
