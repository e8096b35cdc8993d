// See metrics.h. Bucket bounds are vLLM's, so dashboards built for it read ours.
#include "metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace activekv::serve {

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  const size_t b = size_t(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());  // le: v <= bound
  std::lock_guard lock(mu_);
  ++counts_[b];
  sum_ += v;
  ++n_;
}

uint64_t Histogram::count() const {
  std::lock_guard lock(mu_);
  return n_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help,
                       const std::string& labels) const {
  std::lock_guard lock(mu_);
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, bounds_[i], cum);
  }
  out += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n", name, labels, n_);
  out += fmt::format("{}_sum{{{}}} {}\n{}_count{{{}}} {}\n", name, labels, sum_, name, labels, n_);
}

Metrics::Metrics()
    : ttft({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
            80.0}),
      itl({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0}),
      e2e({0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0}) {}

std::string Metrics::render(const std::string& model) const {
  const std::string labels = fmt::format("model_name=\"{}\"", model);
  std::string out;
  auto sample = [&](const char* kind, const char* name, const char* help, auto value, const std::string& extra = {}) {
    out += fmt::format("# HELP activekv:{} {}\n# TYPE activekv:{} {}\n", name, help, name, kind);
    out += fmt::format("activekv:{}{{{}{}}} {}\n", name, labels, extra, value);
  };
  ttft.render(out, "activekv:time_to_first_token_seconds", "Time from a request's arrival to its first token.", labels);
  itl.render(out, "activekv:inter_token_latency_seconds", "Time between two tokens of a request.", labels);
  e2e.render(out, "activekv:e2e_request_latency_seconds", "Time from a request's arrival to its last token.", labels);
  sample("gauge", "num_requests_running", "Requests being prefilled or decoded.", running.load());
  sample("gauge", "num_requests_waiting", "Requests queued for admission.", waiting.load());
  sample("gauge", "kv_host_bytes", "KV history bytes held in host memory by running requests.", kv_host_bytes.load());
  sample("gauge", "kv_gpu_bytes", "KV history bytes held in GPU memory by running requests.", kv_gpu_bytes.load());
  sample("gauge", "prefill_budget_tokens",
         "Prompt tokens a scheduler tick may prefill (the chunk, or less under --itl-target-ms while others decode).",
         prefill_budget_tokens.load());
  sample("counter", "prompt_tokens_total", "Prompt tokens prefilled.", prompt_tokens.load());
  sample("counter", "generation_tokens_total", "Tokens generated.", generation_tokens.load());
  sample("counter", "decode_steps_total", "Batched decode steps (one per scheduler tick with decoding requests).",
         decode_steps.load());
  sample("counter", "history_bytes_read_total", "KV history bytes read by decode attention, all requests.",
         history_bytes_read.load());
  out += "# HELP activekv:request_success_total Requests finished, by reason.\n"
         "# TYPE activekv:request_success_total counter\n";
  for (auto [reason, v] : {std::pair{"stop", &finished_stop}, {"length", &finished_length}, {"abort", &finished_abort}})
    out += fmt::format("activekv:request_success_total{{{},finished_reason=\"{}\"}} {}\n", labels, reason, v->load());
  sample("counter", "request_failure_total", "Requests that failed inside the server after admission.", failed.load());
  return out;
}

}  // namespace activekv::serve
