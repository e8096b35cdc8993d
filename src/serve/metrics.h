// The server's Prometheus metrics (GET /metrics, text format 0.0.4), named as
// vLLM names them with the prefix `activekv:`:
//   histograms  time_to_first_token_seconds, inter_token_latency_seconds,
//               e2e_request_latency_seconds
//   gauges      num_requests_running, num_requests_waiting,
//               kv_host_bytes (history bytes held in host memory by running
//               requests), kv_gpu_bytes (the GPU budget running requests hold; 0 on the CPU path)
//   counters    prompt_tokens_total, generation_tokens_total,
//               request_success_total{finished_reason}, request_failure_total,
//               decode_steps_total (batched steps), history_bytes_read_total
//               (what decode attention read, every sequence)
// Updated by the scheduler thread, read by HTTP threads: every field is
// atomic or behind the histogram's mutex.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace activekv::serve {

class Histogram {
 public:
  /// `bounds`: upper bounds of the buckets, ascending (+Inf is implied).
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  /// Appends the _bucket, _sum and _count lines of `name` with `labels` ("k=\"v\"").
  void render(std::string& out, const std::string& name, const std::string& help, const std::string& labels) const;
  uint64_t count() const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; one more for +Inf
  double sum_ = 0;
  uint64_t n_ = 0;
};

struct Metrics {
  Histogram ttft, itl, e2e;
  std::atomic<int64_t> running{0}, waiting{0};
  std::atomic<int64_t> kv_host_bytes{0}, kv_gpu_bytes{0}, prefill_budget_tokens{0};
  std::atomic<uint64_t> prompt_tokens{0}, generation_tokens{0}, decode_steps{0};
  std::atomic<uint64_t> finished_stop{0}, finished_length{0}, finished_abort{0}, failed{0};
  std::atomic<double> history_bytes_read{0};

  Metrics();
  /// The whole exposition; every sample labelled model_name="<model>".
  std::string render(const std::string& model) const;
};

}  // namespace activekv::serve
