// `activekv generate --device cuda` (and `auto` on a machine with a GPU): the
// whole model on the GPU with its weights in their GGUF types, the KV history
// in the one page store in pinned host memory, each decode step's attention
// streamed or resident as --kv-placement says (activekv/runtime/gpu_runtime.h).
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "activekv/runtime/gpu_runtime.h"
#include "activekv/runtime/tensor_parallel_runtime.h"
#include "commands.h"
#include "generate.h"
#include "stats.h"

namespace activekv::cli {

runtime::RuntimeOptions runtime_options(const GenerateArgs& a, int64_t n_ctx) {
  runtime::RuntimeOptions o;
  o.n_ctx = n_ctx;
  o.page_size = a.page_size;
  o.route.kind = a.kv_format == "bf16" ? route::RouteKind::exact : route::parse_kind(a.kv_format);
  o.route.recent_pages = a.recent_pages;
  o.route.tile_pages = a.tile_pages;
  o.placement = route::parse_placement(a.kv_placement);
  o.gpu_kv_mem = size_t(a.gpu_kv_mem_gib * double(1ull << 30));
  o.convert_threads = a.convert_threads;
  o.prefill_chunk = a.prefill_chunk;
  o.f32_activations = a.matvec_activations == "f32";
  o.cuda_graphs = a.cuda_graphs != "off";
  o.cpu_share = resolve_cpu_share(a.cpu_share, a.kv_placement);
  o.sampling = sampler_params(a);
  return o;
}

namespace {

// "resident on the GPU (chunks of 512)", or "streamed from host memory
// (chunks of 2048, staging 2 x 12 pages): 1234.5 MiB moved".
std::string prefill_history(const runtime::RuntimeStats& st) {
  if (!st.prefill_streamed) return fmt::format("resident on the GPU (chunks of {} tokens)", st.prefill_chunk);
  return fmt::format("streamed from host memory, over the GPU budget (chunks of {} tokens, staging 2 x {} pages): "
                     "{:.1f} MiB moved",
                     st.prefill_chunk, st.prefill_staging_pages, double(st.prefill_moved_bytes) / double(1 << 20));
}

// The model file, its config and tokenizer, the prompt and the context of a GPU generation.
struct GpuInputs {
  gguf::File file;
  model::ModelConfig config;
  Tokenizer tok;
  std::vector<int32_t> prompt;
  int64_t n_ctx = 0;
};

GpuInputs open_inputs(const GenerateArgs& a, GenerationReport& r) {
  r.model_path = a.model.empty() ? default_model_path() : a.model;
  gguf::File file = gguf::File::open(r.model_path);
  model::ModelConfig c = model::ModelConfig::from_gguf(file);
  Tokenizer tok = Tokenizer::from_gguf(file);
  std::vector<int32_t> prompt = prompt_ids(a, tok);
  const int64_t n_ctx = context_size(a, prompt.size());
  if (n_ctx > c.context_length)
    fmt::print(stderr, "warning: context {} exceeds the model's trained context {}\n", n_ctx, c.context_length);
  return {std::move(file), std::move(c), std::move(tok), std::move(prompt), n_ctx};
}

// Prefill done, `next` its token: streams the tokens and decodes until -n
// or end of text, timing each step (GpuRuntime or TensorParallelRuntime).
template <class Runtime>
void decode_tokens(const GenerateArgs& a, const Tokenizer& tok, Runtime& rt, int32_t next, GenerationReport& r) {
  if (!a.chat && !a.prompt && a.prompt_file.empty()) print_generated("[...] ");
  for (int i = 0; i < a.n_predict; ++i) {
    if (!emit_token(tok, next, r)) break;
    if (i + 1 == a.n_predict) break;  // the last token needs no forward pass
    const auto ts = std::chrono::steady_clock::now();
    next = rt.decode(next);
    r.step_ms.push_back(ms_since(ts));
  }
}

int run_generate_tp(const GenerateArgs& a);

}  // namespace

std::string placement_line(const runtime::RuntimeStats& st, double cpu_share) {
  if (st.placement.placement == route::KvPlacement::gpu) return st.placement.reason;
  const std::string cpu = cpu_share < 0   ? "the streamed pages split between the link and the host CPU by the planner "
                                            "(--cpu-share auto)"
                          : cpu_share > 0 ? fmt::format("{:.0f} % of each layer's pages to the host CPU", 100 * cpu_share)
                                          : "no host CPU share (--cpu-share 0)";
  return st.placement.reason + "; " + cpu;
}

int run_generate_gpu(const GenerateArgs& a) {
  if (!a.gpus.empty()) return run_generate_tp(a);
  GenerationReport r;
  auto t0 = std::chrono::steady_clock::now();
  const GpuInputs in = open_inputs(a, r);
  const auto& [file, c, tok, prompt, n_ctx] = in;
  runtime::GpuRuntime rt(file, c, runtime_options(a, n_ctx));
  const runtime::RuntimeStats& st = rt.stats();
  r.load_ms = ms_since(t0);
  r.model_name = c.name.empty() ? c.arch : c.name;
  r.layers = c.layer_split();
  if (st.sliding_layers > 0)  // where each kind of layer keeps its history
    r.layers += fmt::format(" | sliding: last {} tokens resident in GPU rings ({:.1f} MiB), never streamed | global: "
                            "history in host pages ({} placement)",
                            st.window, double(st.ring_bytes) / (1 << 20),
                            route::placement_name(st.placement.placement));
  r.ring_bytes = double(st.ring_bytes);
  r.device = st.device;
  r.kv_format = a.kv_format;
  r.placement = placement_line(st, resolve_cpu_share(a.cpu_share, a.kv_placement));
  r.weight_bytes = double(st.weight_bytes);
  r.prompt_tokens = int64_t(prompt.size());
  fmt::print(stderr, "activekv: {} | {}, weights {:.1f} MiB in GGUF types | {} layers, {} KV heads x {} | {} history, "
             "page {} tokens | kv placement {} | {} prompt tokens\n",
             r.model_path, st.device, double(st.weight_bytes) / (1 << 20), c.n_layers, c.n_kv_heads, c.head_dim,
             a.kv_format, a.page_size, route::placement_name(st.placement.placement), prompt.size());

  t0 = std::chrono::steady_clock::now();
  int32_t next = rt.prefill(prompt, prefill_progress(t0));
  r.prefill_ms = ms_since(t0);
  r.prefill_history = prefill_history(st);
  r.prefill_moved_bytes = double(st.prefill_moved_bytes);
  decode_tokens(a, tok, rt, next, r);
  if (a.cuda_graphs != "off")  // what ran as graphs: none with host placement (not captured), the first step eager
    fmt::print(stderr, "activekv: CUDA graphs: {} of {} decode steps ({} instantiations; {} enqueued ahead){}\n",
               st.graph_steps, st.decode_steps, st.graph_instantiations, st.lookahead_steps,
               st.placement.placement == route::KvPlacement::host ? "; host placement is not captured" : "");
  r.decode_route = st.pages;
  r.streamed_bytes = double(st.streamed_bytes);
  r.resident_bytes = double(st.resident_bytes);
  r.cpu_bytes = double(st.cpu_bytes);
  r.cpu_share = st.placement.placement == route::KvPlacement::gpu ? 0.0 : resolve_cpu_share(a.cpu_share, a.kv_placement);
  r.pages_resident = double(st.resident_pages);
  r.pages_streamed = double(st.streamed_pages);
  r.pages_cpu = double(st.cpu_pages);
  r.residency_upload_bytes = double(st.residency_upload_bytes);
  r.co_attention = st.co_attention;
  r.sliding_bytes = double(st.sliding_bytes);
  report(a, r);
  return 0;
}

namespace {

// `generate --gpus LIST`: the model tensor parallel over the GPUs
// (activekv/runtime/tensor_parallel_runtime.h), one history.
int run_generate_tp(const GenerateArgs& a) {
  GenerationReport r;
  auto t0 = std::chrono::steady_clock::now();
  const GpuInputs in = open_inputs(a, r);
  const auto& [file, c, tok, prompt, n_ctx] = in;
  runtime::RuntimeOptions o = runtime_options(a, n_ctx);
  o.cpu_share = 0;
  o.cuda_graphs = false;  // the tensor-parallel runtime runs kernel by kernel
  runtime::TensorParallelRuntime rt(file, c, o, a.gpus);
  r.load_ms = ms_since(t0);
  const int n = rt.n_shards();
  std::string gpus;
  double weights = 0;
  for (int i = 0; i < n; ++i) {
    gpus += fmt::format("{}{}", i ? "," : "", a.gpus[size_t(i)]);
    weights += double(rt.stats(i).weight_bytes);
  }
  r.model_name = c.name.empty() ? c.arch : c.name;
  r.layers = c.layer_split();
  r.device = fmt::format("{} x {} (GPUs {}), tensor parallel, all-reduce by {}", n, rt.stats(0).device, gpus,
                         rt.uses_nccl() ? "NCCL" : "local sums");
  r.kv_format = a.kv_format;
  r.placement = rt.stats(0).placement.reason + " (each GPU, whole pages; it reads its heads' bytes of them)";
  r.weight_bytes = weights;
  r.prompt_tokens = int64_t(prompt.size());
  fmt::print(stderr, "activekv: {} | {} | weights {:.1f} MiB over {} GPUs | {} layers, {} KV heads x {} | {} history, "
             "page {} tokens | kv placement {} | {} prompt tokens\n",
             r.model_path, r.device, weights / (1 << 20), n, c.n_layers, c.n_kv_heads, c.head_dim, a.kv_format,
             a.page_size,
             route::placement_name(rt.stats(0).placement.placement), prompt.size());
  t0 = std::chrono::steady_clock::now();
  const int32_t next = rt.prefill(prompt, prefill_progress(t0));
  r.prefill_ms = ms_since(t0);
  runtime::RuntimeStats prefill = rt.stats(0);  // shard 0's plan; the bytes every shard moved
  prefill.prefill_moved_bytes = 0;
  for (int i = 0; i < n; ++i) prefill.prefill_moved_bytes += rt.stats(i).prefill_moved_bytes;
  r.prefill_history = prefill_history(prefill) + " (each GPU)";
  r.prefill_moved_bytes = double(prefill.prefill_moved_bytes);
  decode_tokens(a, tok, rt, next, r);
  r.streamed_bytes = r.resident_bytes = 0;
  for (int i = 0; i < n; ++i) {  // bytes: the shards' sums (each moves its heads' part of a page)
    r.streamed_bytes += double(rt.stats(i).streamed_bytes);
    r.resident_bytes += double(rt.stats(i).resident_bytes);
  }
  r.pages_resident = double(rt.stats(0).resident_pages);  // pages: every shard reads every page (its heads)
  r.pages_streamed = double(rt.stats(0).streamed_pages);
  r.decode_route = rt.stats(0).pages;  // pages and their whole bytes, as one GPU would read them
  r.cpu_bytes = 0;
  r.pages_cpu = 0;
  report(a, r);
  return 0;
}

}  // namespace

}  // namespace activekv::cli
