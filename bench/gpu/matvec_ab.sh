#!/usr/bin/env bash
# A/B of the matvec, in one call on one machine (the pool's H200s differ by up
# to 25 % on the same kernel: compare only within a call): ACTIVEKV_*
# switches against the defaults, or this build against a base build's
# binaries (AKV_AB_BASE_BIN). For the GPU machine after `scripts/device_run.sh
# setup` (needs build-device/ and the Debian prefix on LD_LIBRARY_PATH).
#
#   bench/gpu/matvec_ab.sh OUT_DIR 'ACTIVEKV_X=1 [ACTIVEKV_Y=2 ...]'
#   AKV_AB_BASE_BIN=/tmp/akv-base/build/bin bench/gpu/matvec_ab.sh OUT_DIR ['ACTIVEKV_X=1']
#
# Arm A is the default (or, with AKV_AB_BASE_BIN, that directory's
# bench_matvec and activekv), arm B build-device/bin under the setting.
# Alternating A and B, AKV_AB_REPS times (default 2):
#   bench_matvec --types AKV_AB_TYPES (default Q4_0) on the 27B shape's
#     matrices and its QKV group, --nvec AKV_AB_NVEC (default 1: one vector;
#     "1,2,8" for batched decode's), 30 batches;
#   activekv bench on the 27B-shape GGUF of each type in AKV_AB_MODELS
#     (default: AKV_AB_TYPES' first; Q4_0, Q8_0, Q4_K or Q6_K:
#     tools/make_synthetic_gguf.py --type, written to /tmp once) at depth 0:
#     gpu placement, bf16, tg32, -r 5.
# Writes OUT_DIR/${AKV_AB_NAME:-ab}.json ({setting, base_bin, commit, command,
# runs}: every run's own JSON, which records its commit and ACTIVEKV_*
# environment) and prints, per type and matrix and per model, the medians of A
# and B and their ratio B / A.
set -uo pipefail
OUT=${1:?usage: matvec_ab.sh OUT_DIR 'VAR=VALUE ...'}
BASE_BIN=${AKV_AB_BASE_BIN:-}
if [ -n "$BASE_BIN" ]; then SETTING=${2:-}
else SETTING=${2:?usage: matvec_ab.sh OUT_DIR 'VAR=VALUE ...' (or set AKV_AB_BASE_BIN)}; fi
REPS=${AKV_AB_REPS:-2}
B=build-device/bin
TYPES=${AKV_AB_TYPES:-Q4_0}
MODELS=${AKV_AB_MODELS:-${TYPES%%,*}}
NAME=${AKV_AB_NAME:-ab}
NVEC=${AKV_AB_NVEC:-1}
gguf_of() { echo "/tmp/akv-27b-$(echo "$1" | tr 'A-Z' 'a-z').gguf"; }
GEN_PIDS=()
for T in ${MODELS//,/ }; do
  G=$(gguf_of "$T")
  if [ ! -f "$G" ]; then
    python3 tools/make_synthetic_gguf.py --type "$T" "$G" > "/tmp/ab_gguf_$T.log" 2>&1 &
    GEN_PIDS+=($!)
  fi
done
# arm A|B -> "env ... BIN_DIR" pieces: the binaries' directory and the environment.
arm_bin() { if [ "$1" = A ] && [ -n "$BASE_BIN" ]; then echo "$BASE_BIN"; else echo "$B"; fi; }
arm_env() {
  env_args=()
  [ "$1" = B ] && [ -n "$SETTING" ] && read -r -a env_args <<< "$SETTING"
  # Each run's JSON records AKV_COMMIT: the base build's runs get the base commit.
  [ "$1" = A ] && [ -n "$BASE_BIN" ] && env_args+=("AKV_COMMIT=${AKV_BASE_COMMIT:-unknown}")
  return 0
}
W=$(mktemp -d)
for rep in $(seq "$REPS"); do
  for arm in A B; do
    arm_env $arm
    env "${env_args[@]}" timeout 180 "$(arm_bin $arm)/bench_matvec" --types "$TYPES" \
      --shapes 6144x5120,5120x6144,17408x5120,5120x17408,32000x5120 --nvec "$NVEC" --groups 6144+1024+1024x5120 \
      --batches 30 --json "$W/mv_${arm}_$rep.json" > "$W/mv_${arm}_$rep.txt" 2>&1 \
      || echo "== bench_matvec $arm $rep failed: $(tail -1 "$W/mv_${arm}_$rep.txt")"
  done
done
for p in "${GEN_PIDS[@]}"; do wait "$p" || echo "== make_synthetic_gguf.py failed: $(tail -1 /tmp/ab_gguf_*.log)"; done
for T in ${MODELS//,/ }; do
  G=$(gguf_of "$T")
  [ -f "$G" ] || continue
  for rep in $(seq "$REPS"); do
    for arm in A B; do
      arm_env $arm
      env "${env_args[@]}" timeout 120 "$(arm_bin $arm)/activekv" bench -m "$G" -p 0 -n 32 -d 0 -ctk bf16 \
        --kv-placement gpu -r 5 -o md --json "$W/mb-${T}_${arm}_$rep.json" > "$W/mb-${T}_${arm}_$rep.txt" 2>&1 \
        || echo "== activekv bench $T $arm $rep failed: $(tail -1 "$W/mb-${T}_${arm}_$rep.txt")"
    done
  done
done
python3 - "$W" "$OUT/$NAME.json" "$SETTING" "$BASE_BIN" <<'PY'
import glob, json, os, statistics, sys
w, out, setting, base_bin = sys.argv[1:5]
runs = {os.path.basename(p)[:-5]: json.load(open(p)) for p in sorted(glob.glob(f"{w}/*.json"))}
env = ", ".join(f"{k}={os.environ[k]}" for k in ("AKV_AB_REPS", "AKV_AB_TYPES", "AKV_AB_MODELS", "AKV_AB_NVEC")
               if k in os.environ)
json.dump({"setting": setting, "base_bin": base_bin or None, "commit": os.environ.get("AKV_COMMIT"),
           "base_commit": os.environ.get("AKV_BASE_COMMIT") if base_bin else None,
           "command": f"{'AKV_AB_BASE_BIN=' + base_bin + ' ' if base_bin else ''}bench/gpu/matvec_ab.sh OUT "
                      f"'{setting}' ({env or 'defaults'}); each run's command in it",
           "runs": runs}, open(out, "w"), indent=1)
def med(kind, arm, get):
    vals = [v for name, r in runs.items() if name.startswith(f"{kind}_{arm}_") for v in [get(r)] if v is not None]
    return statistics.median(vals) if vals else None
def label_of(row):  # "17408x5120", "6144+1024+1024x5120", with " nv8" for several vectors
    nv = row.get("n_vec", 1)
    return (row.get("group") or f"{row['rows']}x{row['cols']}") + (f" nv{nv}" if nv != 1 else "")
def mv_us(typ, label):
    def get(r):
        for row in r.get("rows", []) + r.get("groups", []):
            if row["type"] == typ and label_of(row) == label:
                return row["us"]
        return None
    return get
labels = []
for r in runs.values():
    if "groups" in r:
        labels = [(x["type"], label_of(x)) for x in r["rows"] + r["groups"]]
        break
a_name = f"base ({base_bin})" if base_bin else "default"
print(f"A/B: A = {a_name}, B = this build{' with ' + setting if setting else ''} "
      f"(medians of {len([n for n in runs if n.startswith('mv_A')])} runs each)")
for typ, label in labels:
    a, b = med("mv", "A", mv_us(typ, label)), med("mv", "B", mv_us(typ, label))
    if a and b: print(f"  matvec {typ:5s} {label:22s} {a:8.2f} us  {b:8.2f} us  x{b / a:.3f}")
ms = lambda r: r["rows"][0]["ms_per_token"] if r.get("rows") else None
for kind in sorted({n.rsplit("_", 2)[0] for n in runs if n.startswith("mb-")}):
    a, b = med(kind, "A", ms), med(kind, "B", ms)
    if a and b: print(f"  model {kind[3:]:5s} depth 0 (ms/token) {a:8.3f}     {b:8.3f}     x{b / a:.3f}")
PY
rm -rf "$W"
