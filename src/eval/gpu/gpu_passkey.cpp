// The passkey check's GPU backend. See include/activekv/eval/gpu_eval.h.
#include "activekv/eval/gpu_eval.h"

namespace activekv::eval {

GpuPasskeyModel::GpuPasskeyModel(const gguf::File& f, const model::ModelConfig& c, int context, int page_size,
                                 const GpuEvalOptions& g)
    : f_(f), c_(c), context_(context), page_size_(page_size), g_(g) {}

void GpuPasskeyModel::begin_prompt(std::span<const int32_t> prefix) { prefix_.assign(prefix.begin(), prefix.end()); }

// Question tokens one decode step each, so that they read the history along
// the route as the CPU backend's question forward does (a GPU prefill reads it exact).
std::vector<int32_t> GpuPasskeyModel::answer(const route::RouteConfig& rc, std::span<const int32_t> question, int n,
                                             const Tokenizer& tok, route::RouteReport& read) {
  runtime::GpuRuntime rt(f_, c_, eval_runtime_options(rc, context_, page_size_, g_));
  rt.prefill(prefix_);
  rt.wait_conversions();
  int32_t next = -1;
  for (int32_t t : question) next = rt.decode(t);
  std::vector<int32_t> out;
  for (;;) {
    out.push_back(next);
    if (int(out.size()) == n || tok.is_end_of_generation(next)) break;
    next = rt.decode(next);
  }
  stats_ = rt.stats();
  for (int i = 0; i < 3; ++i) read.pages[i] += stats_.pages.pages[i];
  for (int i = 0; i < 2; ++i) read.segments[i] += stats_.pages.segments[i];
  read.bytes += stats_.pages.bytes;
  return out;
}

}  // namespace activekv::eval
