// Partial residency: see include/activekv/route/residency.h.
#include "activekv/route/residency.h"

#include <fmt/format.h>

#include <algorithm>

#include "activekv/core/error.h"

namespace activekv::route {
namespace {

// Page indexes in order of preference: tail, sink, recent (newest first), the rest newest first.
std::vector<size_t> preference(size_t n, int sink_pages, int recent_pages) {
  std::vector<size_t> order;
  if (n == 0) return order;
  order.reserve(n);
  std::vector<bool> listed(n, false);
  auto add = [&](size_t p) {
    if (!listed[p]) {
      listed[p] = true;
      order.push_back(p);
    }
  };
  const size_t tail = n - 1;
  add(tail);
  for (size_t p = 0; p < std::min(n, size_t(sink_pages)); ++p) add(p);
  for (size_t k = 0; k < size_t(recent_pages) && k < tail; ++k) add(tail - 1 - k);
  for (size_t p = tail; p-- > 0;) add(p);
  return order;
}

double mib(uint64_t b) { return double(b) / double(1 << 20); }

}  // namespace

std::vector<bool> choose_resident_pages(std::span<const ResidencyPage> pages, int sink_pages, int recent_pages,
                                        const ResidencyLimits& limits) {
  if (sink_pages < 0 || recent_pages < 0)
    throw InvalidArgument(fmt::format("choose_resident_pages: sink_pages {} and recent_pages {} must be >= 0",
                                      sink_pages, recent_pages));
  std::vector<bool> resident(pages.size(), false);
  if (pages.empty()) return resident;
  const size_t tail = pages.size() - 1;
  uint64_t bytes = 0;
  size_t bf16 = 0, encoded = 0;
  for (size_t p : preference(pages.size(), sink_pages, recent_pages)) {
    const ResidencyPage& page = pages[p];
    if (p != tail) {  // the tail is resident whatever it costs
      if (bytes + page.bytes > limits.bytes) continue;
      if (page.encoded ? encoded >= limits.encoded_slots : bf16 >= limits.bf16_slots) continue;
      (page.encoded ? encoded : bf16) += 1;
    }
    bytes += page.bytes;
    resident[p] = true;
  }
  return resident;
}

std::string ResidencyPlan::describe() const {
  return fmt::format("{} of {} pages per layer resident (the tail, {} bf16, {} encoded: {:.1f} of {:.1f} MiB per layer)",
                     resident_pages, layer_pages, bf16_slots, encoded_slots, mib(resident_bytes), mib(history_bytes));
}

ResidencyPlan plan_residency(const RouteConfig& route, int64_t n_ctx, int page_size, int n_layers,
                             uint64_t page_bytes, uint64_t encoded_bytes, uint64_t budget_bytes) {
  if (n_ctx <= 0 || page_size <= 0 || n_layers <= 0 || page_bytes == 0)
    throw InvalidArgument(fmt::format("plan_residency: bad sizes (n_ctx {}, page_size {}, n_layers {}, page_bytes {})",
                                      n_ctx, page_size, n_layers, page_bytes));
  if (route.kind != RouteKind::exact && encoded_bytes == 0)
    throw InvalidArgument(fmt::format("plan_residency: the {} route needs the bytes of an encoded page",
                                      kind_name(route.kind)));
  // The steady state: every full page published in the route's format.
  const RoutePlan steady = plan_route(route, n_ctx, page_size, [](size_t, ReadFormat) { return true; });
  std::vector<ResidencyPage> pages;
  pages.reserve(steady.page_format.size());
  for (ReadFormat f : steady.page_format) {
    const bool enc = f != ReadFormat::exact;
    pages.push_back({enc ? encoded_bytes : page_bytes, enc});
  }
  const std::vector<bool> resident =
      choose_resident_pages(pages, route.sink_pages, route.recent_pages, {budget_bytes / uint64_t(n_layers)});
  ResidencyPlan plan;
  plan.layer_pages = pages.size();
  for (size_t p = 0; p < pages.size(); ++p) {
    plan.history_bytes += pages[p].bytes;
    if (!resident[p]) continue;
    ++plan.resident_pages;
    plan.resident_bytes += pages[p].bytes;
    if (p + 1 == pages.size()) continue;  // the tail has its own slot
    (pages[p].encoded ? plan.encoded_slots : plan.bf16_slots) += 1;
  }
  return plan;
}

}  // namespace activekv::route
