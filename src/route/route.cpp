#include "activekv/route/route.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "activekv/core/error.h"

namespace activekv::route {
namespace {

// The format each page wants under `cfg`, before publication is considered.
ReadFormat wanted(const RouteConfig& cfg, size_t page, size_t n_full) {
  if (cfg.kind == RouteKind::exact) return ReadFormat::exact;
  if (page >= n_full) return ReadFormat::exact;  // the tail is still being written
  if (cfg.kind != RouteKind::hybrid) return compressed_format(cfg.kind);
  const size_t recent_begin = n_full > size_t(cfg.recent_pages) ? n_full - size_t(cfg.recent_pages) : 0;
  if (page < size_t(cfg.sink_pages) || page >= recent_begin) return ReadFormat::exact;  // sink, recent window
  return ReadFormat::int8s;
}

}  // namespace

RouteConfig layer_route(const RouteConfig& cfg, int64_t window) {
  RouteConfig out = cfg;
  if (window > 0) out.kind = RouteKind::exact;  // resident on the GPU: nothing to save on the bus
  return out;
}

ReadFormat compressed_format(RouteKind kind) {
  switch (kind) {
    case RouteKind::lossless13: return ReadFormat::lossless13;
    case RouteKind::int8s:
    case RouteKind::hybrid: return ReadFormat::int8s;
    case RouteKind::exact: break;
  }
  return ReadFormat::exact;
}

RoutePlan plan_route(const RouteConfig& cfg, int64_t n_tokens, int page_size, const PublishedFn& published,
                     size_t first_page) {
  if (page_size <= 0 || cfg.tile_pages <= 0 || cfg.recent_pages < 0 || cfg.sink_pages < 0 || n_tokens < 0) {
    throw InvalidArgument(fmt::format(
        "plan_route: bad arguments (page_size {}, tile_pages {}, recent_pages {}, sink_pages {}, n_tokens {})",
        page_size, cfg.tile_pages, cfg.recent_pages, cfg.sink_pages, n_tokens));
  }
  const size_t n_pages = size_t((n_tokens + page_size - 1) / page_size);
  const size_t n_full = size_t(n_tokens / page_size);
  RoutePlan plan;
  plan.page_format.assign(n_pages, ReadFormat::exact);
  plan.first_page = std::min(first_page, n_pages);
  for (size_t p = plan.first_page; p < n_pages; ++p) {
    ReadFormat f = wanted(cfg, p, n_full);
    if (f != ReadFormat::exact && !(published && published(p, f))) f = ReadFormat::exact;
    plan.page_format[p] = f;
    const Kernel k = f == ReadFormat::int8s ? Kernel::int8s : Kernel::bf16;
    const bool tile_start = p % size_t(cfg.tile_pages) == 0;
    if (!plan.segments.empty() && !tile_start && plan.segments.back().kernel == k) {
      plan.segments.back().n_pages++;
    } else {
      plan.segments.push_back({k, p, 1});
    }
  }
  return plan;
}

std::string kind_name(RouteKind kind) {
  switch (kind) {
    case RouteKind::exact: return "exact";
    case RouteKind::lossless13: return "lossless13";
    case RouteKind::int8s: return "int8s";
    case RouteKind::hybrid: return "hybrid";
  }
  return "?";
}

RouteKind parse_kind(const std::string& name) {
  for (RouteKind k : {RouteKind::exact, RouteKind::lossless13, RouteKind::int8s, RouteKind::hybrid}) {
    if (kind_name(k) == name) return k;
  }
  throw InvalidArgument(fmt::format("unknown route '{}' (expected exact, lossless13, int8s or hybrid)", name));
}

RouteCandidate parse_candidate(const std::string& spec, const RouteConfig& defaults) {
  const size_t colon = spec.find(':');
  RouteCandidate c{route::kind_name(parse_kind(spec.substr(0, colon))), defaults};
  c.config.kind = parse_kind(c.name);
  if (colon == std::string::npos) return c;
  if (c.config.kind != RouteKind::hybrid)
    throw InvalidArgument(fmt::format("route '{}': only hybrid has parameters (recent, sink)", spec));
  bool recent = false, sink = false;
  for (size_t at = colon + 1; at <= spec.size();) {
    const size_t end = std::min(spec.find(',', at), spec.size());
    const std::string item = spec.substr(at, end - at);
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (value.empty() || value.size() > 6 || value.find_first_not_of("0123456789") != std::string::npos)
      throw InvalidArgument(fmt::format("route '{}': '{}' is not key=count", spec, item));
    bool& seen = key == "recent" ? recent : key == "sink" ? sink
        : throw InvalidArgument(fmt::format("route '{}': unknown parameter '{}' (recent, sink)", spec, key));
    if (seen) throw InvalidArgument(fmt::format("route '{}': '{}' given twice", spec, key));
    seen = true;
    (key == "recent" ? c.config.recent_pages : c.config.sink_pages) = std::stoi(value);
    at = end + 1;
  }
  std::vector<std::string> params;
  if (recent) params.push_back(fmt::format("recent={}", c.config.recent_pages));
  if (sink) params.push_back(fmt::format("sink={}", c.config.sink_pages));
  c.name += ":" + params[0] + (params.size() > 1 ? "," + params[1] : "");
  return c;
}

std::vector<std::string> join_candidate_parts(const std::vector<std::string>& parts) {
  std::vector<std::string> out;
  for (const std::string& p : parts) {
    const bool continues = p.find('=') != std::string::npos && p.find(':') == std::string::npos;
    if (!continues) {
      out.push_back(p);
    } else if (out.empty()) {
      throw InvalidArgument(fmt::format("route list: '{}' continues no route (write KIND:{}, e.g. hybrid:{})", p, p, p));
    } else {
      out.back() += "," + p;
    }
  }
  return out;
}

std::string format_name(ReadFormat f) {
  switch (f) {
    case ReadFormat::exact: return "exact";
    case ReadFormat::lossless13: return "lossless13";
    case ReadFormat::int8s: return "int8s";
  }
  return "?";
}

void RouteReport::add(const RoutePlan& plan) {
  for (size_t p = plan.first_page; p < plan.page_format.size(); ++p) pages[size_t(plan.page_format[p])]++;
  for (const Segment& s : plan.segments) segments[size_t(s.kernel)]++;
}

double RouteReport::compressed_fraction() const {
  const size_t all = pages[0] + pages[1] + pages[2];
  return all ? double(all - pages[size_t(ReadFormat::exact)]) / double(all) : 0.0;
}

}  // namespace activekv::route
