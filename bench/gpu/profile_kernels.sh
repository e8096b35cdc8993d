#!/usr/bin/env bash
# Nsight Compute profiles of the kernels that bound a decode step (issues 10
# and 13), for the GPU machine after `scripts/device_run.sh setup` (needs
# build-device/ and the Debian prefix). Writes into $OUT:
#   ncu_matvec.txt     the block-type matvec on two 27B-shape Q4_0 matrices:
#                      speed of light, occupancy, warp stalls, memory
#   ncu_attention.txt  the resident decode kernels at 128K (bf16 split, int8s tc)
#   d0_kernels.txt, d32k_kernels.txt, par8_d32k_kernels.txt
#                      every kernel of the timed decode steps of the
#                      27B-shape model (gpu placement; depth 0, 4 steps;
#                      32K, 4 steps; 8 sequences at 32K, 2 batched steps):
#                      count, total and mean us per kernel name, and the
#                      share of the steps' kernel time
# ncu serialises kernels and lets the clocks idle between them, so small
# kernels read long here; shares, not sums, are the use of d0_kernels.txt;
# step times come from `activekv bench`. Clocks are left alone
# (--clock-control none, as the machine's notes ask).
set -uo pipefail
OUT=${OUT:-/tmp/activekv-out}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu on this machine"; exit 1; }
SECTIONS="--section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis --section SchedulerStats"
B=build-device/bin

# AKV_PROFILE=steps: the decode-step summaries only (the two section profiles take minutes);
# AKV_STEP_ROWS='d0 d32k' (say): which of them.
[ "${AKV_PROFILE:-all}" = steps ] || for S in 17408x5120 5120x5120; do
  echo "== ncu: matvec Q4_0 $S" | tee -a "$OUT/ncu_matvec.txt"
  timeout 120 "$NCU" --clock-control none $SECTIONS -k regex:matvec --launch-skip 40 --launch-count 1 \
    $B/bench_matvec --types Q4_0 --shapes $S --nvec 1 --batches 3 >> "$OUT/ncu_matvec.txt" 2>&1
done

[ "${AKV_PROFILE:-all}" = steps ] || for F in bf16 int8s; do
  K=$([ $F = bf16 ] && echo regex:split_attention || echo regex:int8s_tc)
  echo "== ncu: resident $F at 128K ($K)" | tee -a "$OUT/ncu_attention.txt"
  timeout 150 "$NCU" --clock-control none $SECTIONS -k "$K" --launch-skip 40 --launch-count 1 \
    $B/activekv bench decode --contexts 128k --batches 1 --kv-format $F --modes resident --steps 3 --warmup 1 \
    --profile "" >> "$OUT/ncu_attention.txt" 2>&1
done

G=/tmp/akv-27b-q4_0.gguf
[ -f $G ] || python3 tools/make_synthetic_gguf.py $G > /dev/null
# Every kernel of the timed decode steps of one `activekv bench` row (its
# --profile-timed brackets them with cudaProfilerStart/Stop), summed per
# kernel name into $OUT/<name>_kernels.txt.
profile_steps() {
  local name=$1; shift
  echo "== ncu: every kernel of the timed decode steps ($name): activekv bench $*"
  timeout 300 "$NCU" --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \
    $B/activekv bench -m $G -ctk bf16 -r 1 -o md --profile-timed "$@" > /tmp/${name}_ncu.csv 2>/tmp/${name}_ncu.err
  tail -3 /tmp/${name}_ncu.err
  python3 - /tmp/${name}_ncu.csv > "$OUT/${name}_kernels.txt" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
hdr = rows[0]; rows = rows[1:]
ki, vi, ui = hdr.index("Kernel Name"), hdr.index("Metric Value"), hdr.index("Metric Unit")
tot = collections.defaultdict(float); cnt = collections.Counter()
for r in rows:
    v = float(r[vi].replace(",", "")); u = r[ui]
    us = v / 1000 if u in ("ns", "nsecond") else v * 1000 if u in ("ms", "msecond") else v
    k = r[ki].replace("(anonymous namespace)::", "").replace("<unnamed>::", "").replace("activekv::cuda::", "")
    name = k.split("(")[0].split("<")[0] + ("<" + k.split("<")[1].split(">")[0] + ">" if "<" in k else "")
    tot[name] += us; cnt[name] += 1
all_us = sum(tot.values())
print(f"{len(rows)} kernels, {all_us:.1f} us of kernel time")
for n, t in sorted(tot.items(), key=lambda x: -x[1]):
    print(f"{t:10.1f} us {100*t/all_us:5.1f} % {cnt[n]:5d} x {t/cnt[n]:8.2f} us  {n[:150]}")
PY
  head -30 "$OUT/${name}_kernels.txt"
}
# AKV_STEP_ROWS picks which (default all three).
for row in ${AKV_STEP_ROWS:-d0 d32k par8_d32k}; do
  case $row in
    d0) profile_steps d0 -p 0 -n 4 -d 0 --kv-placement gpu ;;
    d32k) profile_steps d32k -p 0 -n 4 -d 32768 --kv-placement gpu ;;
    par8_d32k) profile_steps par8_d32k -n 2 -d 32768 --kv-placement gpu --parallel 8 ;;
    *) echo "AKV_STEP_ROWS: unknown row '$row' (d0, d32k, par8_d32k)"; exit 2 ;;
  esac
done
grep -E "^  [A-Z].*(Throughput|Achieved Occupancy|Registers|Duration|Theoretical Occupancy|Block Limit)" "$OUT/ncu_matvec.txt" "$OUT/ncu_attention.txt" | head -80
