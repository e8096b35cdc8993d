// The economic gate (SPEC §6): accept a page format F at context N iff the
// transfer time it saves exceeds the GPU time it adds and the quality
// contract (SPEC §5) holds.
//
//   saved(N) = bytes_exact(N) / B(chunk_exact) - bytes_F(N) / B(chunk_F)
//   added(N) = t_kernel_F(N) - t_kernel_exact(N)
//   net      = saved - added;  accept iff net > 0 and quality passes
//
// Inputs are measurements, never constants: bytes per step and B(chunk) come
// from the streamed records of `bench decode` (B = calibrated bandwidth at the
// step's copy size, from the profile measured in the same run), kernel times
// from its resident records (device time of a 16-layer step with the history
// in GPU memory, so no copy hides anything; the gate therefore counts every
// kernel millisecond as added, which can only make it stricter). The measured
// net, exact streamed step minus F's streamed step, is printed beside the
// prediction so a wrong verdict shows. The withdrawn per-tile rule (F's
// kernel must reach >= 0.7x the exact kernel's speed) is evaluated beside it.
// Quality is judged per context from evidence measured at that context or
// longer (judge_quality): nothing beyond the measured contexts is accepted.
// Units: bytes, milliseconds, GB/s = 1e9 bytes/s.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace activekv::cost {

/// One record of `bench decode` JSON (fields of the same names).
struct BenchPoint {
  std::string format;  ///< bf16 | lossless13 | int8s | hybrid
  std::string mode;    ///< streamed | streamed-whole | resident
  int64_t context = 0;
  int batch = 1;
  double step_ms = 0;        ///< wall time of a step, median
  double device_ms = 0;      ///< compute-stream time of a step, median
  double history_bytes = 0;  ///< bytes the step's pages take across the bus
  double chunk_gbps = 0;     ///< calibrated B at the step's copy size
};

/// One quality measurement: an `activekv eval --json` record over all texts
/// ("text": "all") -- or one synthetic own-format case -- for one model,
/// format and context (tokens). A field the eval did not record is empty, and
/// an empty field fails the contract (SPEC §5): nothing passes unmeasured.
struct QualityRecord {
  std::string model;       ///< the eval's "model" (file stem)
  std::string format;      ///< lossless13 | int8s | hybrid | ... ("exact" rows are not kept)
  std::string text;        ///< "all", or the synthetic case's name
  int64_t context = 0;     ///< tokens per window the eval measured at
  std::optional<double> own_format_error;  ///< worst over the samples
  std::optional<double> ppl_increase_pct;
  std::optional<double> top1_agreement;    ///< fraction, 0..1
  /// History bytes per token the route read, over the exact route's in the same
  /// eval (model, context): its cost (issue 11 part 5). Empty when the eval
  /// recorded no bytes or no exact row.
  std::optional<double> bytes_fraction;
  bool synthetic() const { return text != "all"; }
  /// SPEC §5: own-format error <= 0.005, perplexity increase <= 1 %, top-1 >= 99 %, every one measured.
  bool pass() const;
  /// "" when it passes, else the first failed or missing bound, e.g. "top-1 < 99 %".
  std::string failure() const;
  /// "SmolLM2-135M-Instruct.Q4_1 @ 8K: err 0.00018, ppl -0.02 %, top-1 99.6 %"
  std::string describe() const;
};

/// Every quality record read from one or more `eval --json` files.
struct QualityEvidence {
  std::vector<QualityRecord> records;
  /// Adds `other`; a record of the same (model, format, text, context) replaces the earlier one.
  void merge(const QualityEvidence& other);
};

/// The quality verdict for one format at one judged context, naming its evidence.
///
/// For each model that measured the format at a context >= the judged one,
/// the evidence is its record at the smallest such context (quality is
/// measured no shorter than it is claimed) and its records at every shorter
/// context (a decode at the judged context passes through them); the format
/// passes iff every such record passes. A judged context beyond every model's largest measured
/// context is never accepted: the verdict says so and cites the synthetic
/// own-format cases that reach that far, if any (own-format evidence only).
struct Quality {
  std::vector<QualityRecord> evidence;  ///< the real-text records the verdict rests on (empty: none)
  std::vector<QualityRecord> own_format_only;  ///< synthetic cases at >= the judged context, when beyond
  int64_t context = 0;                  ///< the judged context
  int64_t largest_measured = 0;         ///< largest real-text context measured for the format (any model)
  bool pass() const;
  bool beyond_measured() const { return evidence.empty() && largest_measured > 0; }
  /// "pass: <evidence>; ..." / "fail: top-1 < 99 % (<evidence>)" / "not measured beyond 8K (own-format
  /// evidence only: ...)" / "no eval"
  std::string describe() const;
};

/// The verdict for `format` at `context` from `evidence` (see Quality).
Quality judge_quality(const QualityEvidence& evidence, const std::string& format, int64_t context);

struct GateRow {
  std::string format;
  int64_t context = 0;
  double bytes_per_step = 0, bytes_exact = 0;   ///< history bytes of one step (all layers, the batch)
  double saved_ms = 0, added_ms = 0, net_ms = 0;
  double kernel_ms = 0, kernel_exact_ms = 0;
  bool bus_accept = false;        ///< net > 0
  Quality quality;
  bool accept = false;            ///< bus_accept and quality.pass()
  bool withdrawn_rule_accept = false;  ///< kernel_exact_ms / kernel_ms >= 0.7
  double measured_net_ms = 0;     ///< streamed exact step - streamed F step
  bool has_measured_net = false;
  bool sign_matches = false;      ///< (net > 0) == (measured_net > 0)
};

/// Gate rows for every non-bf16 format and context present in `points` at
/// `batch`. A (format, context) lacking a streamed or resident record for
/// itself or for bf16 is skipped. Each row's quality is judge_quality() at
/// the row's context: a format or context without passing evidence is never
/// accepted.
std::vector<GateRow> run_gate(const std::vector<BenchPoint>& points, const QualityEvidence& quality, int batch = 1);

/// One candidate route at one context: what it costs and whether it may be used.
struct RouteOption {
  std::string route;                     ///< eval's format name: "int8s", "hybrid:recent=8,sink=2", ...
  std::optional<double> bytes_fraction;  ///< largest over the evidence records that have one; empty: none has
  Quality quality;                       ///< judge_quality at the context
  const GateRow* gate = nullptr;         ///< the bus verdict at this context when bench measured the route
  /// Usable: quality passes, its bytes are known, and a bench-measured route also wins on the bus.
  bool usable() const;
  /// "" when usable, else why not ("quality: ...", "no bytes measured", "loses on the bus (net -1.2 ms)").
  std::string why_not() const;
};

/// The route the gate picks at one context (issue 11 part 5).
struct RouteChoice {
  int64_t context = 0;
  std::vector<RouteOption> options;  ///< every route with real-text evidence, cheapest first
  std::string chosen = "exact";      ///< the cheapest usable option; "exact" (bf16) when none is usable
  std::optional<double> chosen_bytes_fraction;  ///< of the chosen route (1 for exact)
};

/// Per context in `contexts` (ascending): every route in `quality` with
/// real-text evidence at or beyond that context, costed by its measured bytes
/// per token relative to exact, and the cheapest usable one. A route that
/// `rows` measured on the bus (same name and context) must also win there; a
/// route without bench records (an eval-only candidate such as a hybrid with
/// more exact pages) is costed by its bytes alone.
std::vector<RouteChoice> choose_routes(const QualityEvidence& quality, const std::vector<GateRow>& rows,
                                       const std::vector<int64_t>& contexts);

/// Reads `bench decode --json` output. Throws activekv::Error naming the file
/// and the missing field when it is not one.
std::vector<BenchPoint> read_bench_json(const std::string& path);

/// Reads `activekv eval --json` output: the rows whose "text" is "all" and
/// the synthetic own-format cases (rows with an own_format_error but no
/// perplexity), of every format but "exact" (the reference, never judged).
/// A row's bytes_fraction is its history_bytes_per_token over that of the
/// file's exact row of the same model and context (empty if either is missing).
/// Throws activekv::Error naming the file and field when a row lacks its
/// format, text, model or context, or is not eval output.
QualityEvidence read_eval_json(const std::string& path);

}  // namespace activekv::cost
