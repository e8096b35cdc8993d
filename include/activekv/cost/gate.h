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
// Units: bytes, milliseconds, GB/s = 1e9 bytes/s.
#pragma once

#include <cstdint>
#include <map>
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

/// The quality contract's verdict for one format (from `activekv eval` JSON).
struct Quality {
  bool measured = false;
  double own_format_error = 0;  ///< worst over the samples
  double ppl_increase_pct = 0;
  double top1_agreement = 1;
  bool pass() const { return measured && own_format_error <= 0.005 && ppl_increase_pct <= 1.0 && top1_agreement >= 0.99; }
  std::string describe() const;  ///< "pass (err 0.00018, ppl -0.02 %, top-1 99.6 %)" / "fail: top-1 98.6 % < 99 %"
};

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
/// itself or for bf16 is skipped. Formats without an entry in `quality` get
/// an unmeasured Quality (never accepted).
std::vector<GateRow> run_gate(const std::vector<BenchPoint>& points, const std::map<std::string, Quality>& quality,
                              int batch = 1);

/// Reads `bench decode --json` output. Throws activekv::Error naming the file
/// and the missing field when it is not one.
std::vector<BenchPoint> read_bench_json(const std::string& path);

/// Reads `activekv eval --json` output (the rows whose "text" is "all").
/// bf16 is named "exact" there. Throws activekv::Error as above.
std::map<std::string, Quality> read_eval_json(const std::string& path);

}  // namespace activekv::cost
