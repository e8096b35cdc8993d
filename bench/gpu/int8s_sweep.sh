#!/usr/bin/env bash
# The tc int8s kernel's launch-configuration sweep (issue 13), one device call
# on one GPU: resident decode steps of the 27B shape (bench decode defaults:
# 16 layers, 4 KV heads x 256, group 6, pages of 1024) at 32K and 128K,
# batch 1, for bf16 (the reference), int8s and hybrid, over every launch
# configuration (warps x ring stages x blocks per stage) and two split sizes;
# then hybrid with its two kernels serialised (--serial-formats), the A/B of
# the overlap. One process per split size builds the history once and runs
# every configuration on it. Prints one table (bench/gpu/int8s_sweep_table.py).
#
#   bench/gpu/int8s_sweep.sh [OUT_DIR]      (default $OUT, else /tmp/int8s_sweep)
# Environment: AKV (binary, default build-device/bin/activekv), CONFIGS
# (comma list, default every instantiated one: kConfigs in src/cuda/int8s_tc_attention.cu), SPLITS (default "512 256"),
# STEPS (default 10).
# Budget (estimated, not measured): per process ~15 s of int8s conversion on
# 16 cores + calibration ~10 s + ~1 s per configuration -> ~2 min in all.
set -uo pipefail  # no -e: a failing run (e.g. a record not repeatable: rc 1) still leaves the table
cd "$(dirname "$0")/../.."
OUT_DIR=${1:-${OUT:-/tmp/int8s_sweep}}
AKV=${AKV:-build-device/bin/activekv}
CONFIGS=${CONFIGS:-w4s2cv,w4s4,w2s3,w2s2,w2s4,w4s2,w4s3,w2s2b2,w4s2b2,w2s2c,w2s3c,w4s3c,w4s4c,w3s2c,w4s2c}
SPLITS=${SPLITS:-512 256}
STEPS=${STEPS:-10}
mkdir -p "$OUT_DIR"
rc=0
common=(bench decode --contexts 32k,128k --batches 1 --modes resident --int8s-kernel tc --steps "$STEPS" --warmup 2
        --profile "")
t0=$(date +%s)
for S in $SPLITS; do
  echo "== split $S: bf16, int8s, hybrid x configurations $CONFIGS"
  "$AKV" "${common[@]}" --split "$S" --kv-format bf16,int8s,hybrid --int8s-tc-config "$CONFIGS" \
    --json "$OUT_DIR/int8s_sweep_split$S.json" | grep -E "^  (bf16|int8s|hybrid)|tc kernel configuration|error"
  st=${PIPESTATUS[0]}
  [ "$st" = 0 ] || { echo "-- split $S: bench decode failed (rc $st)"; rc=1; }
  echo "   ($(( $(date +%s) - t0 )) s so far)"
done
S=${SPLITS%% *}
echo "== split $S: hybrid with the bf16 and int8s kernels serialised (--serial-formats), default configuration"
"$AKV" "${common[@]}" --split "$S" --kv-format hybrid --serial-formats \
  --json "$OUT_DIR/int8s_sweep_serial_split$S.json" | grep -E "^  hybrid|error"
st=${PIPESTATUS[0]}
[ "$st" = 0 ] || { echo "-- serialised hybrid: bench decode failed (rc $st)"; rc=1; }
echo "== sweep done in $(( $(date +%s) - t0 )) s"
python3 bench/gpu/int8s_sweep_table.py "$OUT_DIR"/int8s_sweep_*.json | tee "$OUT_DIR/int8s_sweep_table.txt" || rc=1
exit $rc
