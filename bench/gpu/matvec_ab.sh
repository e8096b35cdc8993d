#!/usr/bin/env bash
# A/B of ACTIVEKV_* switches against the defaults, in one call on one machine
# (the pool's H200s differ by up to 25 % on the same kernel: compare only
# within a call). For the GPU machine after `scripts/device_run.sh setup`
# (needs build-device/ and the Debian prefix on LD_LIBRARY_PATH).
#
#   bench/gpu/matvec_ab.sh OUT_DIR 'ACTIVEKV_X=1 [ACTIVEKV_Y=2 ...]'
#
# Alternating default and setting, AKV_AB_REPS times (default 2):
#   bench_matvec --types AKV_AB_TYPES (default Q4_0) on the 27B shape's
#     matrices and its QKV group, one vector, 30 batches;
#   activekv bench on the 27B-shape GGUF of AKV_AB_TYPES' first type (Q4_0,
#     Q8_0, Q4_K or Q6_K: tools/make_synthetic_gguf.py --type, written to
#     /tmp once) at depth 0: gpu placement, bf16, tg32, -r 5.
# Writes OUT_DIR/ab.json ({setting, commit, command, runs}: every run's own
# JSON, which records its ACTIVEKV_* environment) and prints, per matrix and
# for the model, the median of default and setting and their ratio.
set -uo pipefail
OUT=${1:?usage: matvec_ab.sh OUT_DIR 'VAR=VALUE ...'}
SETTING=${2:?usage: matvec_ab.sh OUT_DIR 'VAR=VALUE ...'}
REPS=${AKV_AB_REPS:-2}
B=build-device/bin
TYPE=${AKV_AB_TYPES:-Q4_0}; TYPE=${TYPE%%,*}
G=/tmp/akv-27b-$(echo "$TYPE" | tr 'A-Z' 'a-z').gguf
GEN_PID=
if [ ! -f "$G" ]; then
  python3 tools/make_synthetic_gguf.py --type "$TYPE" "$G" > /tmp/ab_gguf.log 2>&1 &
  GEN_PID=$!
fi
W=$(mktemp -d)
for rep in $(seq "$REPS"); do
  for arm in default setting; do
    env_args=()
    [ "$arm" = setting ] && read -r -a env_args <<< "$SETTING"
    env "${env_args[@]}" timeout 120 $B/bench_matvec --types "${AKV_AB_TYPES:-Q4_0}" \
      --shapes 6144x5120,5120x6144,17408x5120,5120x17408,32000x5120 --nvec 1 --groups 6144+1024+1024x5120 \
      --batches 30 --json "$W/mv_${arm}_$rep.json" > "$W/mv_${arm}_$rep.txt" 2>&1 \
      || echo "== bench_matvec $arm $rep failed: $(tail -1 "$W/mv_${arm}_$rep.txt")"
  done
done
[ -z "$GEN_PID" ] || wait "$GEN_PID" || { echo "== make_synthetic_gguf.py --type $TYPE failed: $(tail -1 /tmp/ab_gguf.log)"; exit 1; }
for rep in $(seq "$REPS"); do
  for arm in default setting; do
    env_args=()
    [ "$arm" = setting ] && read -r -a env_args <<< "$SETTING"
    env "${env_args[@]}" timeout 120 $B/activekv bench -m "$G" -p 0 -n 32 -d 0 -ctk bf16 --kv-placement gpu -r 5 \
      -o md --json "$W/mb_${arm}_$rep.json" > "$W/mb_${arm}_$rep.txt" 2>&1 \
      || echo "== activekv bench $arm $rep failed: $(tail -1 "$W/mb_${arm}_$rep.txt")"
  done
done
python3 - "$W" "$OUT/ab.json" "$SETTING" <<'PY'
import glob, json, os, statistics, sys
w, out, setting = sys.argv[1:4]
runs = {os.path.basename(p)[:-5]: json.load(open(p)) for p in sorted(glob.glob(f"{w}/*.json"))}
json.dump({"setting": setting, "commit": os.environ.get("AKV_COMMIT"),
           "command": f"bench/gpu/matvec_ab.sh OUT '{setting}' (AKV_AB_REPS={os.environ.get('AKV_AB_REPS', '2')}, "
                      f"AKV_AB_TYPES={os.environ.get('AKV_AB_TYPES', 'Q4_0')}); each run's command in it",
           "runs": runs}, open(out, "w"), indent=1)
def med(arm, kind, key):
    vals = [f(r) for name, r in runs.items() if name.startswith(f"{kind}_{arm}_") for f in [key] if f(r) is not None]
    return statistics.median(vals) if vals else None
def mv_us(label):
    def get(r):
        for row in r.get("rows", []) + r.get("groups", []):
            if (row.get("group") or f"{row['rows']}x{row['cols']}") == label and row["type"] == r["rows"][0]["type"]:
                return row["us"]
        return None
    return get
labels = []
for r in runs.values():
    if "groups" in r:
        labels = [f"{x['rows']}x{x['cols']}" for x in r["rows"]] + [g["group"] for g in r["groups"]]
        break
print(f"A/B: default vs {setting} (median of {len([n for n in runs if n.startswith('mb_default')])} runs each)")
for label in labels:
    a, b = med("default", "mv", mv_us(label)), med("setting", "mv", mv_us(label))
    if a and b: print(f"  matvec {label:22s} {a:8.2f} us  {b:8.2f} us  x{b / a:.3f}")
ms = lambda r: r["rows"][0]["ms_per_token"] if r.get("rows") else None
a, b = med("default", "mb", ms), med("setting", "mb", ms)
if a and b: print(f"  model depth 0 (ms/token)      {a:8.3f}     {b:8.3f}     x{b / a:.3f}")
PY
rm -rf "$W"
