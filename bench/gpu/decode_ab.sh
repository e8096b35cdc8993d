#!/usr/bin/env bash
# A/B of two builds' decode attention step, in one call on one machine (the
# pool's H200s differ by up to 25 % on the same kernel: compare only within a
# call). For the GPU machine: `scripts/device_run.sh decode-ab` builds the base
# tree beside build-device/ and calls this.
#
#   bench/gpu/decode_ab.sh OUT_DIR BASE_ACTIVEKV [NEW_ACTIVEKV (build-device/bin/activekv)]
#
# Alternating base and new, AKV_AB_REPS times (default 2), each runs
#   bench decode --contexts 32k,128k --batches 1 --modes resident --split 512
#     --steps 8 --warmup 2 --profile "" --kv-format bf16,int8s,hybrid
#     --int8s-kernel tc   (the default launch configuration)
# (AKV_AB_DECODE_ARGS replaces that argument list). Writes OUT_DIR/decode_ab.json
# ({commit, base_commit, command, runs: every run's own JSON, summary}) and
# prints, per format and context, the median step of base and new and new/base.
set -uo pipefail
OUT=${1:?usage: decode_ab.sh OUT_DIR BASE_ACTIVEKV [NEW_ACTIVEKV]}
BASE=${2:?usage: decode_ab.sh OUT_DIR BASE_ACTIVEKV [NEW_ACTIVEKV]}
NEW=${3:-build-device/bin/activekv}
REPS=${AKV_AB_REPS:-2}
DEFAULT_ARGS='--contexts 32k,128k --batches 1 --modes resident --split 512 --steps 8 --warmup 2 --profile "" --kv-format bf16,int8s,hybrid --int8s-kernel tc'
ARGS=${AKV_AB_DECODE_ARGS:-$DEFAULT_ARGS}
eval "args=($ARGS)"
for b in "$BASE" "$NEW"; do [ -x "$b" ] || { echo "decode_ab.sh: $b is not an executable" >&2; exit 2; }; done
W=$(mktemp -d)
rc=0
for rep in $(seq "$REPS"); do
  for arm in base new; do
    # Each run's JSON records AKV_COMMIT: the base build's runs get the base commit.
    bin=$BASE commit=${AKV_BASE_COMMIT:-unknown}; [ $arm = new ] && bin=$NEW commit=${AKV_COMMIT:-unknown}
    if AKV_COMMIT=$commit timeout 200 "$bin" bench decode "${args[@]}" --json "$W/${arm}_$rep.json" > "$W/${arm}_$rep.txt" 2>&1; then
      echo "== $arm $rep: $(grep -cE '^  ' "$W/${arm}_$rep.txt") rows"
    else
      echo "== $arm $rep failed: $(tail -2 "$W/${arm}_$rep.txt")"; rc=1
    fi
  done
done
python3 - "$W" "$OUT/decode_ab.json" "$ARGS" <<'PY'
import glob, json, os, statistics, sys
w, out, args = sys.argv[1:4]
runs = {os.path.basename(p)[:-5]: json.load(open(p)) for p in sorted(glob.glob(f"{w}/*.json"))}
def steps(r):  # {format@context: step ms} of one run
    got = {}
    for row in r.get("records", []):
        got[f"{row['format']}@{row['context']}/{row['mode']}/b{row['batch']}"] = row["step_ms"]
    return got
per = {name: steps(r) for name, r in runs.items()}
keys = sorted({k for s in per.values() for k in s})
summary = {}
for k in keys:
    b = [s[k] for n, s in per.items() if n.startswith("base_") and k in s]
    n = [s[k] for n_, s in per.items() if n_.startswith("new_") and k in s]
    if b and n:
        summary[k] = {"base_ms": b, "new_ms": n, "new_over_base": round(statistics.median(n) / statistics.median(b), 3)}
        print(f"{k:>28}  base {statistics.median(b):7.3f} ms  new {statistics.median(n):7.3f} ms  new/base {summary[k]['new_over_base']:.3f}")
json.dump({"commit": os.environ.get("AKV_COMMIT"), "base_commit": os.environ.get("AKV_BASE_COMMIT"),
           "command": f"bench/gpu/decode_ab.sh OUT BASE_ACTIVEKV (AKV_AB_REPS={os.environ.get('AKV_AB_REPS', '2')}; "
                      f"bench decode {args}); each run's command in it",
           "summary": summary, "runs": runs}, open(out, "w"), indent=1)
PY
exit $rc
