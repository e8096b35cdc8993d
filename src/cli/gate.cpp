// `activekv gate`: the economic gate of SPEC §6 over measured results -- a
// `bench decode --json` file (bytes, B(chunk), kernel and step times from one
// GPU run) and an `eval --json` file (the quality contract). CPU only: it
// reads measurements, it does not take them.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <set>
#include <nlohmann/json.hpp>

#include "activekv/core/error.h"
#include "activekv/core/text_file.h"
#include "activekv/cost/gate.h"
#include "commands.h"
#include "options.h"
#include "provenance.h"

namespace activekv::cli {
namespace {

struct GateArgs {
  std::string bench = ACTIVEKV_SOURCE_DIR "/bench/results/h200_bench_formats.json";
  std::vector<std::string> eval{ACTIVEKV_SOURCE_DIR "/bench/results/eval-SmolLM2-135M-Instruct.Q4_1.json",
                                ACTIVEKV_SOURCE_DIR "/bench/results/h200_eval_gpu_int8s.json",
                                ACTIVEKV_SOURCE_DIR "/bench/results/h200_eval_gemma3_8k.json",
                                // Through the GPU runtime (eval --device cuda --f32-activations): a
                                // later file's record of the same model, format and context wins.
                                ACTIVEKV_SOURCE_DIR "/bench/results/h200_eval_gpu_smollm2_8k.json",
                                ACTIVEKV_SOURCE_DIR "/bench/results/h200_eval_gpu_gemma3_8k.json",
                                ACTIVEKV_SOURCE_DIR "/bench/results/h200_eval_gpu_gemma3_16k.json",
                                ACTIVEKV_SOURCE_DIR "/bench/results/h200_eval_gpu_gemma3_32k.json"};
  int batch = 1;
  std::string json_out;
};

void print_rows(const std::vector<cost::GateRow>& rows) {
  fmt::print("{:<10} {:>7} {:>10} {:>9} {:>9} {:>9} {:>7} {:>8} {:>12} {:>10} {:>6}  {}\n", "format", "context",
             "bytes/step", "saved ms", "added ms", "net ms", "gate", "verdict", "0.7x rule", "meas. net", "sign",
             "quality");
  for (const auto& r : rows) {
    const bool false_reject = r.accept && !r.withdrawn_rule_accept;  // the old rule throws away an accepted saving
    fmt::print("{:<10} {:>6}K {:>9.3f}x {:>9.3f} {:>9.3f} {:>9.3f} {:>7} {:>8} {:>12} {:>10.3f} {:>6}  {}\n", r.format,
               r.context / 1024, r.bytes_per_step / r.bytes_exact, r.saved_ms, r.added_ms, r.net_ms,
               r.bus_accept ? "win" : "lose", r.accept ? "ACCEPT" : "reject",
               r.withdrawn_rule_accept ? "accept" : (false_reject ? "reject (!)" : "reject"), r.measured_net_ms,
               r.sign_matches ? "ok" : "WRONG", r.quality.describe());
  }
}

nlohmann::json evidence_json(const cost::Quality& q) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : q.evidence.empty() ? q.own_format_only : q.evidence)
    out.push_back({{"model", r.model}, {"text", r.text}, {"context", r.context},
                   {"own_format_error", r.own_format_error ? nlohmann::json(*r.own_format_error) : nullptr},
                   {"ppl_increase_pct", r.ppl_increase_pct ? nlohmann::json(*r.ppl_increase_pct) : nullptr},
                   {"top1_agreement", r.top1_agreement ? nlohmann::json(*r.top1_agreement) : nullptr},
                   {"pass", r.pass()}});
  return out;
}

// Contexts to choose a route at: every one the bench measured, and every one an eval measured.
std::vector<int64_t> choice_contexts(const std::vector<cost::GateRow>& rows, const cost::QualityEvidence& q) {
  std::set<int64_t> n;
  for (const auto& r : rows) n.insert(r.context);
  for (const auto& r : q.records)
    if (!r.synthetic()) n.insert(r.context);
  return {n.begin(), n.end()};
}

std::string fraction(const std::optional<double>& f) { return f ? fmt::format("{:.3f}x", *f) : "-"; }

void print_choices(const std::vector<cost::RouteChoice>& choices) {
  fmt::print("\nroute per context (issue 11 part 5): the usable route with the fewest history bytes per token "
             "(x exact's, measured by eval); a route bench measured must also win on the bus.\n");
  for (const auto& c : choices) {
    fmt::print("{:>6}K  chosen: {} ({}){}\n", c.context / 1024, c.chosen, fraction(c.chosen_bytes_fraction),
               c.options.empty() ? "  -- no route's quality is measured this far" : "");
    for (const auto& o : c.options)
      fmt::print("          {:<26} {:>8}  {}\n", o.route, fraction(o.bytes_fraction),
                 o.usable() ? "usable: " + o.quality.describe() : o.why_not());
  }
}

nlohmann::json choices_json(const std::vector<cost::RouteChoice>& choices) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& c : choices) {
    nlohmann::json opts = nlohmann::json::array();
    for (const auto& o : c.options)
      opts.push_back({{"route", o.route},
                      {"bytes_fraction", o.bytes_fraction ? nlohmann::json(*o.bytes_fraction) : nullptr},
                      {"usable", o.usable()}, {"why_not", o.why_not()}, {"quality", o.quality.describe()},
                      {"quality_evidence", evidence_json(o.quality)}, {"bench_measured", o.gate != nullptr}});
    out.push_back({{"context", c.context}, {"chosen", c.chosen},
                   {"chosen_bytes_fraction", c.chosen_bytes_fraction ? nlohmann::json(*c.chosen_bytes_fraction) : nullptr},
                   {"options", opts}});
  }
  return out;
}

nlohmann::json to_json(const std::vector<cost::GateRow>& rows, const GateArgs& a) {
  nlohmann::json out = {{"commit", git_commit()}, {"command", command_line()}, {"bench", a.bench},
                        {"eval", a.eval}, {"batch", a.batch}};
  for (const auto& r : rows)
    out["rows"].push_back({{"format", r.format}, {"context", r.context}, {"bytes_per_step", r.bytes_per_step},
                           {"bytes_exact", r.bytes_exact}, {"saved_ms", r.saved_ms}, {"added_ms", r.added_ms},
                           {"net_ms", r.net_ms}, {"kernel_ms", r.kernel_ms}, {"kernel_exact_ms", r.kernel_exact_ms},
                           {"bus_accept", r.bus_accept}, {"quality", r.quality.describe()},
                           {"quality_pass", r.quality.pass()}, {"quality_evidence", evidence_json(r.quality)},
                           {"quality_beyond_measured", r.quality.beyond_measured()}, {"accept", r.accept},
                           {"withdrawn_rule_accept", r.withdrawn_rule_accept},
                           {"measured_net_ms", r.measured_net_ms}, {"sign_matches", r.sign_matches}});
  return out;
}

}  // namespace

void add_gate(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<GateArgs>();
  app.add_option("--bench", a->bench, "`bench decode --json` output with bf16 and candidate formats, "
                                      "streamed and resident")->capture_default_str()->check(non_empty());
  app.add_option("--eval", a->eval, "`eval --json` outputs (the quality contract per model, format and "
                                    "context; a later file's record of the same model, format and context "
                                    "replaces an earlier one's)")->capture_default_str();
  app.add_option("--batch", a->batch, "Batch size of the records to judge")->capture_default_str()
      ->check(in_range(1, 1 << 20));
  app.add_option("--json", a->json_out, "Also write the rows as JSON")->check(non_empty());
  run = [a] {
    if (!a->json_out.empty()) {  // before the work
      check_writable(a->json_out, "gate --json output");
      std::vector<std::string> inputs = a->eval;
      inputs.push_back(a->bench);
      check_not_an_input(a->json_out, inputs, "gate --json output");
    }
    const auto points = cost::read_bench_json(a->bench);
    cost::QualityEvidence quality;
    for (const auto& path : a->eval) quality.merge(cost::read_eval_json(path));
    const auto rows = cost::run_gate(points, quality, a->batch);
    if (rows.empty()) {
      std::set<int> batches;
      for (const auto& p : points) batches.insert(p.batch);
      throw activekv::InvalidArgument(fmt::format(
          "gate: {} holds no (format, context) with streamed and resident records for both bf16 and a candidate "
          "at batch {} (batches in the file: {})", a->bench, a->batch, fmt::join(batches, ", ")));
    }
    fmt::print("economic gate (SPEC 6), batch {}: net = transfer saved - kernel time added; accept iff net > 0 and "
               "the quality contract holds at that context (evidence: model @ context measured).\n  bench: {}\n  eval:  {}\n\n", a->batch, a->bench, fmt::join(a->eval, ", "));
    print_rows(rows);
    int wrong = 0, false_rejects = 0;
    for (const auto& r : rows) {
      wrong += !r.sign_matches;
      false_rejects += r.accept && !r.withdrawn_rule_accept;
    }
    const auto choices = cost::choose_routes(quality, rows, choice_contexts(rows, quality));
    print_choices(choices);
    fmt::print("\n{} of {} verdicts match the sign of the measured net time; the withdrawn 0.7x kernel-speed rule "
               "would have rejected {} accepted (format, size) pairs that save time (marked !).\n", rows.size() - size_t(wrong), rows.size(),
               false_rejects);
    if (!a->json_out.empty()) {
      nlohmann::json out = to_json(rows, *a);
      out["choices"] = choices_json(choices);
      write_text_file(a->json_out, out.dump(2) + "\n", "gate --json output");
      fmt::print("JSON written to {}\n", a->json_out);
    }
    return wrong == 0 ? 0 : 1;
  };
}

}  // namespace activekv::cli
