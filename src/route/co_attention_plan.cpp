// The co-attention planner: see include/activekv/route/co_attention_plan.h.
#include "activekv/route/co_attention_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "activekv/core/error.h"

namespace activekv::route {

void CoAttentionRates::validate() const {
  auto positive = [](double v, const char* what) {
    if (!(v > 0 && std::isfinite(v)))
      throw InvalidArgument(fmt::format("co-attention rates: {} is {} GB/s, not a positive rate", what, v));
  };
  positive(link_gbps, "the link");
  positive(cpu_bf16_gbps, "the CPU over bf16 pages");
  positive(cpu_int8s_gbps, "the CPU over int8s pages");
  for (const auto& [v, what] : {std::pair{cpu_layer_latency_ms, "CPU layer latency"},
                                 std::pair{cpu_bf16_task_ms, "bf16 CPU task cost"},
                                 std::pair{cpu_int8s_task_ms, "int8s CPU task cost"}})
    if (!(v >= 0 && std::isfinite(v))) throw InvalidArgument(fmt::format("co-attention rates: a {} of {} ms", what, v));
  for (const double r : {resident_bf16_gbps, resident_int8s_gbps})
    if (!(r >= 0 && std::isfinite(r)))
      throw InvalidArgument(fmt::format("co-attention rates: a resident rate of {} GB/s (0: not measured)", r));
}

double CoAttentionRates::cpu_task_ms(double b16, double b8) const {
  return b16 + b8 > 0 ? (b16 * cpu_bf16_task_ms + b8 * cpu_int8s_task_ms) / (b16 + b8) : 0.0;
}

std::string CoAttentionPlan::describe() const {
  const std::string resident = resident_ms > 0 ? fmt::format(", resident {:.2f} ms", resident_ms) : std::string();
  return fmt::format("CPU {} pages per layer ({:.0f} %): link {:.2f} ms{}, CPU {:.2f} ms -> {:.2f} ms predicted "
                     "(link alone {:.2f} ms)",
                     cpu_pages, 100 * share, link_ms, resident, cpu_ms, predicted_ms, link_only_ms);
}

namespace {

// A layer's link time when the CPU reads host memory for the first `cpu_ms`
// of it: `bytes` move at `busy_gbps` while the CPU reads and at `alone_gbps`
// after (two phases). Measured on the H200 host at a5be516 (128K bf16,
// link-bound): the link averaged 53.6 GB/s with the CPU busy for 35 % of the
// step and 51.9 with it busy for 74 %, against 55.2 alone -- a rate that
// falls with the CPU's busy share, as two phases give.
double link_layer_ms(double bytes, double cpu_ms, double busy_gbps, double alone_gbps) {
  const double busy_ms = bytes / (busy_gbps * 1e6);
  if (busy_ms <= cpu_ms) return busy_ms;
  return cpu_ms + (bytes - cpu_ms * busy_gbps * 1e6) / (alone_gbps * 1e6);
}

// Walks the CPU page count up from 0; keeps the step `keep` prefers.
template <class Keep>
CoAttentionPlan walk(std::span<const PlanPage> layer, int n_layers, const CoAttentionRates& rates,
                     double link_alone_gbps, Keep keep) {
  rates.validate();
  if (!(link_alone_gbps > 0 && std::isfinite(link_alone_gbps)))
    throw InvalidArgument(fmt::format("co-attention plan: the link alone at {} GB/s is not a positive rate", link_alone_gbps));
  if (n_layers <= 0) throw InvalidArgument("co-attention plan: n_layers must be positive");
  const double L = double(n_layers);
  auto ms = [](double bytes, double gbps) { return bytes / (gbps * 1e6); };
  double streamed = 0;     // bytes per layer over the link with no CPU share
  double resident_ms = 0;  // per layer: the GPU over the resident pages (0 where the rate was not measured)
  for (const PlanPage& p : layer) {
    if (!p.resident) {
      streamed += double(p.bytes);
      continue;
    }
    const double rate = p.kind == PlanPage::int8s ? rates.resident_int8s_gbps : rates.resident_bf16_gbps;
    if (rate > 0) resident_ms += ms(double(p.bytes), rate);
  }

  CoAttentionPlan best;
  best.resident_ms = L * resident_ms;
  best.link_ms = L * ms(streamed, link_alone_gbps);
  best.link_only_ms = best.predicted_ms = std::max(best.link_ms, best.resident_ms);  // zero CPU pages
  double link_bytes = streamed, read_ms = 0, bf16_bytes = 0, int8s_bytes = 0;
  size_t taken = 0;
  for (const PlanPage& p : layer) {
    if (p.resident || p.kind == PlanPage::other) continue;
    link_bytes -= double(p.bytes);
    read_ms += ms(double(p.bytes), p.kind == PlanPage::bf16 ? rates.cpu_bf16_gbps : rates.cpu_int8s_gbps);
    (p.kind == PlanPage::bf16 ? bf16_bytes : int8s_bytes) += double(p.bytes);
    const double cpu_ms = rates.cpu_layer_latency_ms + rates.cpu_task_ms(bf16_bytes, int8s_bytes) + read_ms;
    ++taken;
    const double link_ms = link_layer_ms(link_bytes, cpu_ms, rates.link_gbps, link_alone_gbps);
    const double step = L * std::max({link_ms, resident_ms, cpu_ms});
    if (keep(taken, step, best.predicted_ms)) {
      best.cpu_pages = taken;
      best.link_ms = L * link_ms;
      best.cpu_ms = L * cpu_ms;
      best.predicted_ms = step;
      best.cpu_bf16_bytes = bf16_bytes;
      best.cpu_int8s_bytes = int8s_bytes;
    }
  }
  best.share = layer.empty() ? 0.0 : double(best.cpu_pages) / double(layer.size());
  return best;
}

}  // namespace

CoAttentionPlan plan_co_attention(std::span<const PlanPage> layer, int n_layers, const CoAttentionRates& rates,
                                  double link_alone_gbps) {
  return walk(layer, n_layers, rates, link_alone_gbps,
              [](size_t, double step, double best) { return step < best; });
}

CoAttentionPlan predict_co_attention(std::span<const PlanPage> layer, int n_layers, const CoAttentionRates& rates,
                                     double link_alone_gbps, size_t cpu_pages) {
  return walk(layer, n_layers, rates, link_alone_gbps,
              [cpu_pages](size_t taken, double, double) { return taken <= cpu_pages; });
}

}  // namespace activekv::route
