// The economic gate. See include/activekv/cost/gate.h.
#include "activekv/cost/gate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <type_traits>
#include <nlohmann/json.hpp>

#include "activekv/core/error.h"
#include "activekv/core/printable.h"

namespace activekv::cost {
namespace {

const BenchPoint* find(const std::vector<BenchPoint>& pts, const std::string& format, bool streamed, int64_t ctx,
                       int batch) {
  for (const BenchPoint& p : pts)
    if (p.format == format && p.context == ctx && p.batch == batch && (p.mode == "streamed") == streamed &&
        (streamed || p.mode == "resident"))
      return &p;
  return nullptr;
}

nlohmann::json load(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw Error("gate: " + path + " is a directory, not a JSON file");
  std::ifstream f(path);
  if (!f) throw Error(fmt::format("gate: cannot open '{}': {}", path, std::strerror(errno)));
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    // The parser's own words without its id ("[json.exception.parse_error.101] "),
    // bytes outside printable ASCII (the invalid UTF-8 it quotes) escaped.
    std::string what = e.what();
    if (const size_t id_end = what.find("] "); what.rfind("[json.exception.", 0) == 0 && id_end != std::string::npos)
      what.erase(0, id_end + 2);
    std::string line;
    for (const unsigned char c : what) line += c >= 0x20 && c < 0x7f ? std::string(1, char(c)) : fmt::format("\\x{:02x}", c);
    throw Error(fmt::format("gate: {} is not JSON: {}", path, line));
  }
}

template <class T>
T field(const nlohmann::json& j, const char* name, const std::string& path) {
  if (!j.contains(name) || j[name].is_null())
    throw Error(fmt::format("gate: {}: a record lacks \"{}\"", path, name));
  const nlohmann::json& v = j[name];
  if constexpr (std::is_integral_v<T>) {
    // 8192.5 or 1e308 would be cut or wrapped by get<T>: a count is a whole number in T's range.
    const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(std::numeric_limits<T>::max())
                      : v.is_number_integer()
                          ? v.get<int64_t>() >= int64_t(std::numeric_limits<T>::min()) &&
                                v.get<int64_t>() <= int64_t(std::numeric_limits<T>::max())
                          : false;
    if (!fits) throw Error(fmt::format("gate: {}: field \"{}\" is {}, not a whole number in range", path, name, v.dump()));
    return v.get<T>();
  } else {
    try {
      return v.get<T>();
    } catch (const nlohmann::json::exception&) {
      throw Error(fmt::format("gate: {}: field \"{}\" has the wrong type", path, name));
    }
  }
}

std::string context_label(int64_t n) {
  return n % 1024 == 0 ? fmt::format("{}K", n / 1024) : fmt::format("{}", n);
}

std::optional<double> optional_number(const nlohmann::json& r, const char* name, const std::string& path) {
  if (!r.contains(name) || r[name].is_null()) return std::nullopt;
  if (!r[name].is_number()) throw Error(fmt::format("gate: {}: field \"{}\" has the wrong type", path, name));
  return r[name].get<double>();
}

}  // namespace

bool QualityRecord::pass() const { return failure().empty(); }

std::string QualityRecord::failure() const {
  if (!own_format_error) return "no own-format error measured";
  if (*own_format_error > 0.005) return "own-format error > 0.005";
  if (synthetic()) return "";  // a synthetic case measures the own-format error only
  if (!ppl_increase_pct) return "no perplexity measured";
  if (*ppl_increase_pct > 1.0) return "ppl increase > 1 %";
  if (!top1_agreement) return "no top-1 agreement measured";
  if (*top1_agreement < 0.99) return "top-1 < 99 %";
  return "";
}

std::string QualityRecord::describe() const {
  auto num = [](const std::optional<double>& v, const char* f) { return v ? fmt::format(fmt::runtime(f), *v) : "-"; };
  std::string s = fmt::format("{} @ {}{}: err {}", model, context_label(context), synthetic() ? " " + text : "",
                              num(own_format_error, "{:.5f}"));
  if (!synthetic())
    s += fmt::format(", ppl {} %, top-1 {} %", num(ppl_increase_pct, "{:+.2f}"),
                     top1_agreement ? fmt::format("{:.1f}", 100 * *top1_agreement) : "-");
  return s;
}

void QualityEvidence::merge(const QualityEvidence& other) {
  for (const QualityRecord& r : other.records) {
    auto same = [&](const QualityRecord& x) {
      return x.model == r.model && x.format == r.format && x.text == r.text && x.context == r.context;
    };
    std::erase_if(records, same);
    records.push_back(r);
  }
}

bool Quality::pass() const {
  if (evidence.empty()) return false;
  return std::all_of(evidence.begin(), evidence.end(), [](const QualityRecord& r) { return r.pass(); });
}

std::string Quality::describe() const {
  std::vector<std::string> parts;
  if (beyond_measured()) {
    for (const QualityRecord& r : own_format_only) parts.push_back(r.describe());
    return fmt::format("not measured beyond {} (own-format evidence only: {})", context_label(largest_measured),
                       parts.empty() ? "none" : fmt::format("{}", fmt::join(parts, "; ")));
  }
  if (evidence.empty()) return "no eval";
  std::string why;
  for (const QualityRecord& r : evidence) {
    parts.push_back(r.describe());
    if (why.empty()) why = r.failure();
  }
  return fmt::format("{} ({})", why.empty() ? "pass" : "fail: " + why, fmt::join(parts, "; "));
}

Quality judge_quality(const QualityEvidence& evidence, const std::string& format, int64_t context) {
  Quality q;
  q.context = context;
  std::map<std::string, const QualityRecord*> per_model;  // smallest measured context >= the judged one
  for (const QualityRecord& r : evidence.records) {
    if (r.format != format) continue;
    if (r.synthetic()) {
      if (r.context >= context) q.own_format_only.push_back(r);
      continue;
    }
    q.largest_measured = std::max(q.largest_measured, r.context);
    if (r.context < context) continue;
    const QualityRecord*& best = per_model[r.model];
    if (!best || r.context < best->context) best = &r;
  }
  // A decode at the judged context passes through every shorter one: a
  // model's records below it count too (int8s on Gemma 3 measured 98.7 %
  // top-1 at 16K and 99.2 % at 32K -- noise of ~0.4 % over 768 positions --
  // and must not be accepted at 32K on the second alone).
  for (const auto& [model, r] : per_model) {
    for (const QualityRecord& s : evidence.records)
      if (s.model == model && s.format == format && !s.synthetic() && s.context < context) q.evidence.push_back(s);
    q.evidence.push_back(*r);
  }
  if (!q.evidence.empty()) q.own_format_only.clear();
  return q;
}

std::vector<GateRow> run_gate(const std::vector<BenchPoint>& points, const QualityEvidence& quality, int batch) {
  std::vector<std::string> formats;
  std::vector<int64_t> contexts;
  for (const BenchPoint& p : points) {
    if (p.batch != batch) continue;
    if (p.format != "bf16" && std::find(formats.begin(), formats.end(), p.format) == formats.end())
      formats.push_back(p.format);
    if (std::find(contexts.begin(), contexts.end(), p.context) == contexts.end()) contexts.push_back(p.context);
  }
  std::sort(contexts.begin(), contexts.end());
  std::vector<GateRow> rows;
  for (const std::string& f : formats) {
    for (int64_t n : contexts) {
      const BenchPoint* es = find(points, "bf16", true, n, batch);
      const BenchPoint* er = find(points, "bf16", false, n, batch);
      const BenchPoint* fs = find(points, f, true, n, batch);
      const BenchPoint* fr = find(points, f, false, n, batch);
      if (!es || !er || !fs || !fr) continue;
      GateRow r;
      r.format = f;
      r.context = n;
      r.bytes_exact = es->history_bytes;
      r.bytes_per_step = fs->history_bytes;
      r.saved_ms = es->history_bytes / (es->chunk_gbps * 1e6) - fs->history_bytes / (fs->chunk_gbps * 1e6);
      r.kernel_ms = fr->device_ms;
      r.kernel_exact_ms = er->device_ms;
      r.added_ms = fr->device_ms - er->device_ms;
      r.net_ms = r.saved_ms - r.added_ms;
      r.bus_accept = r.net_ms > 0;
      r.quality = judge_quality(quality, f, n);
      r.accept = r.bus_accept && r.quality.pass();
      r.withdrawn_rule_accept = fr->device_ms > 0 && er->device_ms / fr->device_ms >= 0.7;
      r.measured_net_ms = es->step_ms - fs->step_ms;
      r.has_measured_net = true;
      r.sign_matches = (r.net_ms > 0) == (r.measured_net_ms > 0);
      rows.push_back(r);
    }
  }
  return rows;
}

bool RouteOption::usable() const { return why_not().empty(); }

std::string RouteOption::why_not() const {
  if (!quality.pass()) return "quality: " + quality.describe();
  if (!bytes_fraction) return "no bytes measured";
  if (gate && !gate->bus_accept) return fmt::format("loses on the bus (net {:+.3f} ms)", gate->net_ms);
  return "";
}

std::vector<RouteChoice> choose_routes(const QualityEvidence& quality, const std::vector<GateRow>& rows,
                                       const std::vector<int64_t>& contexts) {
  std::vector<std::string> routes;
  for (const QualityRecord& r : quality.records)
    if (!r.synthetic() && std::find(routes.begin(), routes.end(), r.format) == routes.end()) routes.push_back(r.format);
  std::vector<RouteChoice> out;
  for (int64_t n : contexts) {
    RouteChoice c;
    c.context = n;
    c.chosen_bytes_fraction = 1.0;
    for (const std::string& route : routes) {
      RouteOption o{route, std::nullopt, judge_quality(quality, route, n)};
      if (o.quality.evidence.empty()) continue;  // nothing measured this far: not an option here
      // The costliest model's bytes among those that recorded them (the fraction
      // depends on context, page size and route, not on the model's weights).
      // Only the records measured at or beyond n price it: a shorter context's
      // history is less compressed (more of it is the exact recent window).
      for (const QualityRecord& r : o.quality.evidence)
        if (r.bytes_fraction && r.context >= n)
          o.bytes_fraction = std::max(o.bytes_fraction.value_or(0.0), *r.bytes_fraction);
      for (const GateRow& g : rows)
        if (g.format == route && g.context == n) o.gate = &g;
      c.options.push_back(o);
    }
    std::stable_sort(c.options.begin(), c.options.end(), [](const RouteOption& a, const RouteOption& b) {
      return a.bytes_fraction.value_or(INFINITY) < b.bytes_fraction.value_or(INFINITY);
    });
    for (const RouteOption& o : c.options) {
      if (o.usable() && *o.bytes_fraction < 1.0) {
        c.chosen = o.route;
        c.chosen_bytes_fraction = o.bytes_fraction;
        break;
      }
    }
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<BenchPoint> read_bench_json(const std::string& path) {
  const nlohmann::json j = load(path);
  if (!j.is_object() || !j.contains("records") || !j["records"].is_array())
    throw Error("gate: " + path + " has no \"records\" array (is it `bench decode --json` output?)");
  std::vector<BenchPoint> out;
  for (const auto& r : j["records"]) {
    BenchPoint p;
    p.format = field<std::string>(r, "format", path);
    p.mode = field<std::string>(r, "mode", path);
    p.context = field<int64_t>(r, "context", path);
    p.batch = field<int>(r, "batch", path);
    p.step_ms = field<double>(r, "step_ms", path);
    p.device_ms = field<double>(r, "device_ms", path);
    p.history_bytes = field<double>(r, "history_bytes", path);
    p.chunk_gbps = field<double>(r, "chunk_gbps", path);
    if (!(p.chunk_gbps > 0)) throw Error(fmt::format("gate: {}: chunk_gbps must be positive", path));
    out.push_back(p);
  }
  return out;
}

QualityEvidence read_eval_json(const std::string& path) {
  const nlohmann::json j = load(path);
  if (!j.is_array()) throw Error("gate: " + path + " is not `activekv eval --json` output (expected an array)");
  // The exact route's bytes per token per (model, context): each route's cost is relative to it.
  std::map<std::pair<std::string, int64_t>, double> exact_bytes;
  for (const auto& r : j) {
    if (!r.is_object() || !r.contains("format") || r["format"] != "exact" || !r.contains("text") || r["text"] != "all")
      continue;
    const auto b = optional_number(r, "history_bytes_per_token", path);
    if (b && *b > 0) exact_bytes[{printable(field<std::string>(r, "model", path), 256), field<int64_t>(r, "context", path)}] = *b;
  }
  QualityEvidence out;
  for (const auto& r : j) {
    if (!r.is_object()) throw Error("gate: " + path + ": a record is not an object (is it `activekv eval --json` output?)");
    QualityRecord q;
    q.text = field<std::string>(r, "text", path);
    q.format = field<std::string>(r, "format", path);
    if (q.format == "exact") continue;  // the reference
    q.own_format_error = optional_number(r, "own_format_error", path);
    q.ppl_increase_pct = optional_number(r, "ppl_increase_pct", path);
    q.top1_agreement = optional_number(r, "top1_agreement", path);
    // Values no eval can produce: a hand-edited or corrupt file, not evidence.
    const auto out_of_range = [&](const char* name, double v, const char* range) {
      throw Error(fmt::format("gate: {}: a {} record has {} {} (must be {})", path, q.format, name, v, range));
    };
    if (q.own_format_error && !(*q.own_format_error >= 0 && std::isfinite(*q.own_format_error)))
      out_of_range("own_format_error", *q.own_format_error, "finite and >= 0");
    if (q.ppl_increase_pct && !(*q.ppl_increase_pct > -100 && std::isfinite(*q.ppl_increase_pct)))
      out_of_range("ppl_increase_pct", *q.ppl_increase_pct, "finite and > -100");
    if (q.top1_agreement && !(*q.top1_agreement >= 0 && *q.top1_agreement <= 1))
      out_of_range("top1_agreement", *q.top1_agreement, "in [0, 1]");
    const bool synthetic_case = q.own_format_error && !q.ppl_increase_pct;
    if (q.text != "all" && !synthetic_case) continue;  // one text's row: "all" holds the aggregate
    q.model = printable(field<std::string>(r, "model", path), 256);  // printed in the verdicts: no raw control bytes
    q.context = field<int64_t>(r, "context", path);
    if (q.context <= 0) throw Error(fmt::format("gate: {}: a record has context {}", path, q.context));
    const auto bytes = optional_number(r, "history_bytes_per_token", path);
    const auto exact = exact_bytes.find({q.model, q.context});
    if (bytes && exact != exact_bytes.end()) q.bytes_fraction = *bytes / exact->second;
    out.records.push_back(q);
  }
  return out;
}

}  // namespace activekv::cost
