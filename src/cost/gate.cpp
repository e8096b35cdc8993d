// The economic gate. See include/activekv/cost/gate.h.
#include "activekv/cost/gate.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "activekv/core/error.h"

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
  if (!f) throw Error("gate: cannot open " + path);
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("gate: {} is not JSON: {}", path, e.what()));
  }
}

template <class T>
T field(const nlohmann::json& j, const char* name, const std::string& path) {
  if (!j.contains(name) || j[name].is_null())
    throw Error(fmt::format("gate: {}: a record lacks \"{}\"", path, name));
  try {
    return j[name].get<T>();
  } catch (const nlohmann::json::exception&) {
    throw Error(fmt::format("gate: {}: field \"{}\" has the wrong type", path, name));
  }
}

}  // namespace

std::string Quality::describe() const {
  if (!measured) return "no eval";
  const std::string figures = fmt::format("err {:.5f}, ppl {:+.2f} %, top-1 {:.1f} %", own_format_error,
                                          ppl_increase_pct, 100 * top1_agreement);
  if (pass()) return "pass (" + figures + ")";
  std::string why;
  if (own_format_error > 0.005) why = "own-format error > 0.005";
  else if (ppl_increase_pct > 1.0) why = "ppl increase > 1 %";
  else why = "top-1 < 99 %";
  return "fail: " + why + " (" + figures + ")";
}

std::vector<GateRow> run_gate(const std::vector<BenchPoint>& points, const std::map<std::string, Quality>& quality,
                              int batch) {
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
      const auto q = quality.find(f);
      if (q != quality.end()) r.quality = q->second;
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

std::map<std::string, Quality> read_eval_json(const std::string& path) {
  const nlohmann::json j = load(path);
  if (!j.is_array()) throw Error("gate: " + path + " is not `activekv eval --json` output (expected an array)");
  std::map<std::string, Quality> out;
  for (const auto& r : j) {
    if (field<std::string>(r, "text", path) != "all") continue;
    std::string f = field<std::string>(r, "format", path);
    if (f == "exact") f = "bf16";
    Quality q;
    q.measured = true;
    q.own_format_error = r.contains("own_format_error") && !r["own_format_error"].is_null()
                             ? r["own_format_error"].get<double>()
                             : 0.0;
    q.ppl_increase_pct = field<double>(r, "ppl_increase_pct", path);
    q.top1_agreement = field<double>(r, "top1_agreement", path);
    out[f] = q;
  }
  return out;
}

}  // namespace activekv::cost
