#!/usr/bin/env bash
# Is the co-attention calibration's CPU rate an artefact of its history size?
# Alternating ACTIVEKV_COATT_HISTORY_MIB settings (AKV_SIZES, default
# "256 2048": Xeon hosts of this generation have 105-480 MiB of L3, so 1 GiB
# may not be far enough past it), AKV_REPS times each (default 3), each a
# fresh process (a fresh calibration): bench decode on the 27B shape at 128K, bf16, streamed, at CPU
# share 0.7 (the CPU the longer path: its rate sets the step) and auto.
# Writes OUT_DIR/coatt_history_ab.json ({commit, command, host_lscpu, runs, summary})
# and prints per size the calibrated CPU rate with the link busy against the
# rate the steps then read at, and the prediction errors.
#
#   bench/gpu/coatt_history_ab.sh OUT_DIR [ACTIVEKV (build-device/bin/activekv)]
set -uo pipefail
OUT=${1:?usage: coatt_history_ab.sh OUT_DIR [ACTIVEKV]}
AKV=${2:-build-device/bin/activekv}
[ -x "$AKV" ] || { echo "coatt_history_ab.sh: $AKV is not an executable" >&2; exit 2; }
# The Debian libraries scripts/device_run.sh unpacked (its exports do not reach this shell).
PFX=/tmp/akv-prefix/usr/lib/x86_64-linux-gnu
[ -d "$PFX" ] && export LD_LIBRARY_PATH=$PFX:$PFX/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
ARGS="--contexts 128k --batches 1 --kv-format bf16 --modes streamed --cpu-share 0.7,auto --cpu-threads ${AKV_THREADS:-15} --steps 4 --warmup 1"
W=$(mktemp -d)
rc=0
for rep in $(seq "${AKV_REPS:-3}"); do
  for mib in ${AKV_SIZES:-256 2048}; do
    if ACTIVEKV_COATT_HISTORY_MIB=$mib timeout 120 "$AKV" bench decode $ARGS --json "$W/m${mib}_$rep.json" \
        > "$W/m${mib}_$rep.txt" 2>&1; then
      echo "== $mib MiB, run $rep: ok"
    else
      echo "== $mib MiB, run $rep failed: $(tail -2 "$W/m${mib}_$rep.txt")"; rc=1
    fi
  done
done
lscpu > "$W/lscpu.txt" 2>&1  # the host's caches: what the history must outgrow
python3 - "$W" "$OUT/coatt_history_ab.json" "$ARGS" <<'PY'
import glob, json, os, re, statistics, sys
w, out, args = sys.argv[1:4]
lscpu = open(f"{w}/lscpu.txt").read()
runs, rows = {}, {}
for p in sorted(glob.glob(f"{w}/*.json")):
    name = os.path.basename(p)[:-5]
    d = json.load(open(p))
    runs[name] = d
    mib = int(re.match(r"m(\d+)_", name).group(1))
    rates = d["co_attention_rates"]
    # bench decode's text: "CPU share, bf16 streamed+cpu70% depth 131072: busy 60.44 ms/step at 99.9 GB/s"
    txt = open(p[:-5] + ".txt").read()
    measured = [float(m) for m in re.findall(r"busy [\d.]+ ms/step at ([\d.]+) GB/s", txt)]
    shared = [r for r in d["records"] if r.get("cpu_share") not in (None, 0)]
    for i, r in enumerate(shared):
        # cpu_measured_gbps: the CPU's bytes in the step over its busy time (bench decode's text line,
        # in the records' share order), what cpu_with_link_gbps should have been.
        rows.setdefault(mib, []).append({
            "run": name, "share": r["cpu_share"], "step_ms": r["step_ms"], "predicted_ms": r["predicted_ms"],
            "error_pct": 100 * r["prediction_error"], "cpu_with_link_gbps": rates["cpu_bf16_with_link_gbps"],
            "cpu_measured_gbps": measured[i] if i < len(measured) else None})
summary = {}
for mib, rs in sorted(rows.items()):
    e = [x["error_pct"] for x in rs]
    c = [x["cpu_with_link_gbps"] for x in rs]
    m = [x["cpu_measured_gbps"] for x in rs if x["cpu_measured_gbps"]]
    summary[mib] = {"rows": len(rs), "error_pct_median": statistics.median(e), "error_pct_min": min(e),
                    "error_pct_max": max(e), "calibrated_cpu_gbps": sorted(set(round(x, 1) for x in c)),
                    "measured_cpu_gbps": [round(x, 1) for x in m]}
    print(f"{mib:>6} MiB: prediction error median {statistics.median(e):6.1f} % (range {min(e):.1f} .. {max(e):.1f}), "
          f"calibrated CPU with link {summary[mib]['calibrated_cpu_gbps']} GB/s, "
          f"the steps' CPU {summary[mib]['measured_cpu_gbps']} GB/s")
json.dump({"commit": os.environ.get("AKV_COMMIT"),
           "command": f"bench/gpu/coatt_history_ab.sh OUT (AKV_SIZES={os.environ.get('AKV_SIZES', '256 2048')}, "
                      f"AKV_REPS={os.environ.get('AKV_REPS', '3')}; bench decode {args}); each run's command in it",
           "host_lscpu": lscpu,
           "summary": summary, "rows": rows, "runs": runs}, open(out, "w"), indent=1)
PY
exit $rc
