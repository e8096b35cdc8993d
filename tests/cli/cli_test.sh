#!/usr/bin/env bash
# The activekv command as a user meets it: bad arguments, paths and sizes get
# one line naming the problem and a non-zero exit; the summary and the eval
# table say what happened. One case per ctest entry (tests/cli/CMakeLists.txt):
#   cli_test.sh <activekv binary> <case>
# Cases that run the model use the default one (scripts/setup.sh installs it).
set -uo pipefail
AKV=$1
CASE=$2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0

fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# expect <exit code> <text the output must hold> -- <activekv arguments...>
expect() {
  local want_rc=$1 want_text=$2
  shift 3
  local out rc
  out=$("$AKV" "$@" 2>&1)
  rc=$?
  if [ "$rc" != "$want_rc" ]; then
    fail "activekv $* exited $rc, expected $want_rc; output: $(tail -n 3 <<<"$out")"
  elif ! grep -qF -- "$want_text" <<<"$out"; then
    fail "activekv $* (exit $rc) did not say '$want_text'; output: $(tail -n 3 <<<"$out")"
  else
    echo "ok: activekv $* -> exit $rc, '$want_text'"
  fi
}

# A tiny synthetic llama GGUF (tools/make_synthetic_gguf.py: random Q4_0
# weights, 2 layers, head dim 64 as the GPU kernels need), made once per case.
tiny_model() {
  [ -f "$TMP/tiny.gguf" ] || python3 "$(dirname "$0")/../../tools/make_synthetic_gguf.py" "$TMP/tiny.gguf" \
    --layers 2 --hidden 256 --heads 4 --kv-heads 2 --head-dim 64 --ffn 512 --vocab 512 > /dev/null \
    || fail "tools/make_synthetic_gguf.py failed"
  echo "$TMP/tiny.gguf"
}

# activekv bench on the tiny model: the JSON parses, every row is there with
# its label, two repetitions, t/s > 0, and decode rows carry a floor the
# measurement does not beat by much. $1: device flags, $2: placements.
check_bench() {
  local json="$TMP/bench.json" model
  model=$(tiny_model)
  if ! ACTIVEKV_PROVENANCE_CHECK=on "$AKV" bench -m "$model" $1 --kv-placement "$2" -p 16 -n 4 -d 0,64 -r 2 -ctk bf16,hybrid --page-size 16 \
      -o json > "$json" 2> "$TMP/bench.log"; then
    fail "bench $1 --kv-placement $2 failed: $(tail -n 3 "$TMP/bench.log")"
    return
  fi
  python3 - "$json" "$2" <<'EOF' || fail "bench $1 --kv-placement $2: JSON checks failed"
import json, math, sys
j = json.load(open(sys.argv[1]))
placements = sys.argv[2].split(",")
cpu = j["device"].startswith("cpu")
m = j["model"]
close = lambda a, b: abs(a - b) <= 1e-6 * abs(b)
assert (j["bandwidth"]["probes"] is not None) == cpu, j["bandwidth"]
assert j["commit"] and "bench" in j["command"] and j["depth_fill"] == "prefill", j
assert j["environment"].get("ACTIVEKV_PROVENANCE_CHECK") == "on", j["environment"]  # the A/B switches are recorded
assert j["model"]["n_layers"] == 2 and j["model"]["shape_27b"] is False
rows = {(r["test"], r["kv_format"], r["kv_placement"]): r for r in j["rows"]}
want = {(t, f, p) for t in ("tg4", "pp16", "tg4 @ d64", "pp16 @ d64") for f in ("bf16", "hybrid") for p in placements}
assert set(rows) == want, sorted(set(rows) ^ want)
for key, r in rows.items():
    assert len(r["reps_ms"]) == 2 and len(r["reps_depth_start"]) == 2, key
    assert all(x > 0 and math.isfinite(x) for x in r["reps_tokens_per_s"]), key
    assert r["tokens_per_s_mean"] > 0 and r["ms_per_token"] > 0, key
    assert r["llama_cpp_ms"] is None, key  # not the 27B shape
    if r["kind"] == "tg":
        assert r["reps_depth_start"][0] >= r["depth"], key
        probes = r["bandwidth_probes_gbps"]
        if cpu:
            # The floor's bandwidth is probed right before and right after each repetition's timed
            # steps, and the floor is priced at their mean: check that it is.
            assert len(probes) == 2 * len(r["reps_ms"]), (key, probes)
            assert all(x > 0 and math.isfinite(x) for x in probes), (key, probes)
            assert close(r["floor_weights_gbps"], sum(probes) / len(probes)), key
            assert close(r["floor_ms"], (j["weight_bytes_per_token"] + r["history_bytes_per_token"])
                         / (r["floor_weights_gbps"] * 1e6)), key
            # The bytes the floor counts, against the model's shape (what catches an overcount
            # the timing bound below cannot): the weights as the CPU holds them -- for the tiny
            # model every tensor as stored (F32 norms, Q4_0 matrices: 18-byte blocks of 32), all
            # but the untied embedding, of which the one row a step looks up; a bf16 history read
            # whole at every step (tokens before the step, and its own).
            q4_0 = lambda n: n // 32 * 18
            want = m["file_bytes"] - q4_0(m["vocab"] * m["d_model"]) + q4_0(m["d_model"])
            assert close(j["weight_bytes_per_token"], want), (key, j["weight_bytes_per_token"], want)
            if r["kv_format"] == "bf16":
                per_token = m["n_layers"] * 2 * m["n_kv_heads"] * m["head_dim"] * 2
                n = r["n_tokens"]
                read = sum(d + i + 1 for d in r["reps_depth_start"] for i in range(n)) / (n * len(r["reps_ms"]))
                assert close(r["history_bytes_per_token"], per_token * read), (key, r["history_bytes_per_token"])
        else:
            assert probes is None, key  # the GPU's floors use the bandwidths measured up front
        # A step cannot read its bytes faster than the bandwidth measured beside it (over a working
        # set of the weights' size): a ratio well below 1 means a floor counting bytes the step does
        # not read, or a bandwidth that is not the memory's. CPU, 2-core dev machine, this test's
        # command: with the bandwidth measured once before the rows the ratio read 2.9-13 with a
        # build beside it, but 0.19 and 0.24 (tg4 @ d64) while another whole build shared the 2
        # cores (.ci/run at 1dabdbd, a helper's ctest), and the bound had gone down to 0.1. With the
        # floor at the probes around the timed steps (dcb339b): 1.32-2.26 over 16 rows, 4 runs, on
        # the quiet machine; 1.79-77 over 120 rows, 30 runs, with a whole CPU build or other
        # helpers' work beside it (load 2.4-7.2), where the same rows priced at the up-front figure
        # read 0.14-27. Bound 0.4, about 3x below the lowest. On a quiet machine it fails a floor
        # ~3.5x too high (1.32 / 0.4), too many bytes or too low a bandwidth; a 3x byte overcount it
        # would pass (that takes a row below 1.2), and under load, where ratios run high, far more:
        # the exact byte checks above catch those. GPU rows: 0.1, as before (bandwidths measured
        # up front there; nothing else shares the H200).
        bound = 0.4 if cpu else 0.1
        assert r["floor_ms"] > 0 and r["floor_ratio"] >= bound, (key, r["floor_ratio"], bound)
        # GPU host placement at depth 0: the few tokens sit in the tail page, which has a device copy,
        # so nothing streams; every other decode row reads history.
        assert r["history_bytes_per_token"] > 0 or r["depth"] == 0 or r["kv_placement"] == "partial", key
    else:
        assert r["floor_ms"] is None, key
    # The plan line names the placement that ran (GPU); partial says what stays resident.
    if r["kv_placement"] == "partial":
        assert r["plan"].startswith("partial") and "resident" in r["plan"], (key, r["plan"])
        if r["kind"] == "tg" and r["depth"] > 0:
            # Pages stay resident; some stream unless the plan kept them all (hybrid's encoded
            # pages are smaller: at this budget all 7 fit, where bf16 keeps 6 of 7).
            import re
            kept, total = map(int, re.search(r"(\d+) of (\d+) pages per layer resident", r["plan"]).groups())
            # The others stream over the link or go to the host CPU (--cpu-share auto may take them
            # all: then no history bytes cross; H200, bf16 at d64: 6 of 7 kept, the 7th CPU-attended).
            assert r["resident_bytes_per_token"] > 0, key
            assert kept < total or r["history_bytes_per_token"] == 0, (key, r["plan"])
            if r["kv_format"] == "bf16":
                assert kept < total, (key, r["plan"])
print("ok: bench JSON,", len(rows), "rows")
EOF
  "$AKV" bench -m "$model" $1 --kv-placement "$2" -p 16 -n 4 -d 64 -r 1 --page-size 16 -o md > "$TMP/bench.md" 2> "$TMP/bench.log" \
    && grep -qF "| tg4 @ d64 |" "$TMP/bench.md" && grep -qF "| x floor |" "$TMP/bench.md" \
    && echo "ok: bench -o md table" || fail "bench -o md: $(cat "$TMP/bench.md" "$TMP/bench.log" | tail -n 5)"
}

# activekv bench --parallel 1,2 on the tiny model (GPU): every row has finite, positive figures, its
# rounds, its sequences' tokens, and a floor; the fills are reported; and sequence 0's greedy tokens
# with --parallel 2 (decoded in a batch of two) are those it decodes alone (--parallel 1), per
# placement (the exact route: no background conversion to race with).
check_bench_parallel() {
  local model json="$TMP/par.json" p n
  model=$(tiny_model)
  if ! "$AKV" bench -m "$model" --device cuda --parallel 1,2 -n 4 -d 0,64 -r 2 -ctk bf16,hybrid --kv-placement host,gpu \
      --page-size 16 -o json > "$json" 2> "$TMP/par.log"; then
    fail "bench --parallel 1,2 failed: $(tail -n 3 "$TMP/par.log")"
    return
  fi
  python3 - "$json" <<'PY' || fail "bench --parallel: JSON checks failed"
import json, math, sys
j = json.load(open(sys.argv[1]))
assert j["parallel"] is True and j["batch_limit"] >= 2 and j["commit"] and "--parallel" in j["command"], j
rows = {(r["test"], r["kv_format"], r["kv_placement"]): r for r in j["rows"]}
want = {(f"tg4{d} x{n}", f, p) for d in ("", " @ d64") for n in (1, 2) for f in ("bf16", "hybrid") for p in ("host", "gpu")}
assert set(rows) == want, sorted(set(rows) ^ want)
for key, r in rows.items():
    n = r["n_seqs"]
    assert r["rounds"] == 1 and len(r["reps_ms"]) == 2 and len(r["reps_depth_start"]) == 2, key
    assert all(x > 0 and math.isfinite(x) for x in r["reps_ms"] + r["reps_tokens_per_s"]), key
    assert r["tokens_per_s_mean"] > 0 and r["ms_per_step"] > 0 and r["floor_ms"] > 0, key
    assert abs(r["tokens_per_s_per_seq"] * n - r["tokens_per_s_mean"]) < 1e-6 * r["tokens_per_s_mean"], key
    # GPU rows (this test runs on the H200 only; passed there at 3b949ac): a ratio well below 1 is
    # a floor counting bytes the step does not read.
    assert r["floor_ratio"] >= 0.3, (key, r["floor_ratio"])
    assert r["history_bytes_per_step"] > 0 or r["depth"] == 0, key
    assert r["reps_depth_start"][0] >= max(r["depth"], 1), key
    assert len(r["seq_tokens"]) == n and all(len(t) == 2 * 4 for t in r["seq_tokens"]), key
    assert all(0 <= t < j["model"]["vocab"] for s in r["seq_tokens"] for t in s), key
# Two sequences read about twice one's history per step (the d64 rows; the x2 row's first sequence is ~10 tokens deeper).
for f in ("bf16", "hybrid"):
    for p in ("host", "gpu"):
        one, two = rows[("tg4 @ d64 x1", f, p)], rows[("tg4 @ d64 x2", f, p)]
        assert 1.5 < two["history_bytes_per_step"] / one["history_bytes_per_step"] < 2.5, (f, p, one, two)
fills = j["fills"]
assert len(fills) == 8, fills
assert all(len(f["fill_s"]) == 2 and f["fill_tokens_per_seq"] == max(f["depth"], 1) for f in fills), fills
print("ok: bench --parallel JSON,", len(rows), "rows")
PY
  "$AKV" bench -m "$model" --device cuda --parallel 2 -n 4 -d 64 -r 1 --page-size 16 -o md > "$TMP/par.md" \
      2> "$TMP/par.log" && grep -qF "| tg4 @ d64 x2 | 2 | 1 |" "$TMP/par.md" && grep -qF "rounds of at most" "$TMP/par.md" \
    && echo "ok: bench --parallel -o md table" || fail "bench --parallel -o md: $(cat "$TMP/par.md" "$TMP/par.log" | tail -n 5)"
  for p in host gpu; do
    for n in 1 2; do
      "$AKV" bench -m "$model" --device cuda --parallel $n -n 8 -d 40 -r 1 -ctk bf16 --kv-placement $p --page-size 16 \
        -o json > "$TMP/solo$n.json" 2> "$TMP/par.log" || fail "bench --parallel $n --kv-placement $p: $(tail -n 3 "$TMP/par.log")"
    done
    python3 - "$TMP/solo1.json" "$TMP/solo2.json" <<'PY' && echo "ok: --kv-placement $p: sequence 0 decodes alike alone and in a batch of 2" \
      || fail "--kv-placement $p: sequence 0's tokens in a batch of 2 differ from alone"
import json, sys
solo, pair = (json.load(open(f))["rows"][0]["seq_tokens"] for f in sys.argv[1:])
assert len(solo) == 1 and len(pair) == 2 and len(solo[0]) == 8, (solo, pair)
assert solo[0] == pair[0], (solo[0], pair[0])
PY
  done
}

case $CASE in
  bench)  # activekv bench on the CPU path, and its one-line refusals
    check_bench "--device cpu -t 2" host
    m=$(tiny_model)
    expect 1 "bench: -ctk f16 is llama.cpp's name" -- bench -m "$m" --device cpu -ctk f16
    expect 1 "bench: -ctk q4: unknown kv format" -- bench -m "$m" --device cpu -ctk bf16,q4
    expect 1 "bench: -o xml: md or json" -- bench -m "$m" --device cpu -o xml
    expect 105 "-r/--repetitions: Value 0 not in range 1" -- bench -m "$m" --device cpu -r 0
    expect 1 "bench: nothing to run" -- bench -m "$m" --device cpu -n 0 -p 0
    expect 1 "bench: --kv-placement gpu needs --device cuda" -- bench -m "$m" --device cpu --kv-placement host,gpu
    expect 1 "bench: --kv-placement disk: auto, host, gpu or partial" -- bench -m "$m" --device cpu --kv-placement disk
    expect 1 "bench: --kv-placement partial needs --device cuda" -- bench -m "$m" --device cpu --kv-placement partial
    expect 1 "bench: --gpu-kv-mem applies to --device cuda only" -- bench -m "$m" --device cpu --gpu-kv-mem 1
    expect 1 "bench: --cpu-share applies to --device cuda only" -- bench -m "$m" --device cpu --cpu-share 0
    expect 1 "bench: --cuda-graphs applies to --device cuda only" -- bench -m "$m" --device cpu --cuda-graphs on
    expect 105 "--device: foo not in {auto,cpu,cuda}" -- bench -m "$m" --device foo  # ran on the CPU before (README trial)
    expect 1 "not enough memory for the KV page store" -- bench -m "$m" --device cpu -d 1000000000 -p 0 -n 1
    expect 1 "cannot write bench --json output" -- bench -m "$m" --device cpu --json /nonexistent_dir/x.json
    expect 1 "bench: --parallel needs a GPU (--device cuda" -- bench -m "$m" --device cpu --parallel 1,2 -n 4
    expect 1 "bench: --seq-gpu-kv-mem applies to --parallel only" -- bench -m "$m" --device cpu --seq-gpu-kv-mem 1
    expect 1 "bench: --gpus needs --device cuda" -- bench -m "$m" --device cpu --gpus 0,1
    # Weights of inf (float16 scales overflowed): the first row's logits are NaN, and the bench stops.
    python3 "$(dirname "$0")/../../tools/make_synthetic_gguf.py" "$TMP/inf.gguf" --layers 2 --hidden 256 --heads 4 \
      --kv-heads 2 --head-dim 64 --ffn 512 --vocab 512 --weight-std 1e9 > /dev/null 2>&1
    expect 1 "(not finite): the model's weights or a kernel are broken" -- bench -m "$TMP/inf.gguf" --device cpu -r 1 -n 2 -p 0
    # The K-quant models the tool writes (the Q4_K/Q6_K matvec measurements) run with finite logits.
    for t in Q4_K Q6_K; do
      python3 "$(dirname "$0")/../../tools/make_synthetic_gguf.py" "$TMP/$t.gguf" --layers 2 --hidden 512 --heads 4 \
        --kv-heads 2 --head-dim 64 --ffn 1024 --vocab 512 --type $t > /dev/null 2>&1 || fail "make_synthetic_gguf --type $t"
      "$AKV" bench -m "$TMP/$t.gguf" --device cpu -r 1 -n 2 -p 0 > "$TMP/$t.out" 2>&1 || fail "bench on the synthetic $t model: $(tail -1 "$TMP/$t.out")"
    done
    ;;
  bench_gpu)  # the same through runtime::GpuRuntime, streamed (host) and resident (gpu)
    check_bench "--device cuda" host,gpu
    check_bench "--device cuda --cuda-graphs on" host,gpu  # gpu placement's decode steps as CUDA graphs
    # A budget of ~13 pages for the 14 the d64 rows need in bf16 (2 layers; the tiny model's page: 8 KiB):
    # partial residency, the rest streamed and split with the host CPU by the planner (--cpu-share auto, the
    # default there). The streamed prefill at d64 needs 96 KiB of it (0.00005 GiB, ~6.5 pages, was refused).
    check_bench "--device cuda --gpu-kv-mem 0.0001" partial
    # Tensor parallel over two shards on GPU 0 (local sums; --gpus 0,1 needs two GPUs): bench rows and a generation.
    m=$(tiny_model)
    out=$("$AKV" bench -m "$m" --device cuda --gpus 0,0 --kv-placement host,gpu -ctk bf16,hybrid --page-size 16 -d 64 -p 16 -n 4 -r 1 2>&1) \
      || fail "bench --gpus 0,0: $(tail -n 3 <<<"$out")"
    grep -qF "tensor parallel" <<<"$out" || fail "bench --gpus 0,0 does not name the split: $(tail -n 3 <<<"$out")"
    grep -qF "tg4 @ d64" <<<"$out" || fail "bench --gpus 0,0 has no decode row: $(tail -n 5 <<<"$out")"
    out=$("$AKV" generate -m "$m" --device cuda --gpus 0,0 -p "hello" -n 8 2>&1) \
      || fail "generate --gpus 0,0: $(tail -n 3 <<<"$out")"
    grep -qF "tensor parallel, all-reduce by local sums" <<<"$out" || fail "generate --gpus 0,0: $(tail -n 3 <<<"$out")"
    echo "ok: bench and generate --gpus 0,0"
    ;;
  bench_parallel_gpu)  # bench --parallel: N sequences on one GpuModel, decode_batch in rounds (bench_parallel.h)
    check_bench_parallel
    ;;
  bench_decode_args)  # bench decode's refusals of head shards, before touching a GPU (CUDA builds)
    # bench --parallel's refusals, also before any GPU work (the model file is read, the GPU not touched)
    m=$(tiny_model)
    expect 1 "bench: --parallel 0: a count of sequences is in [1, 1024]" -- bench -m "$m" --device cuda --parallel 0
    expect 1 "bench: --parallel 2 is given twice" -- bench -m "$m" --device cuda --parallel 2,2
    expect 1 "bench: --parallel times decode steps only" -- bench -m "$m" --device cuda --parallel 2 -p 16
    expect 1 "bench: --parallel times decode steps: -n 0 must be > 0" -- bench -m "$m" --device cuda --parallel 2 -n 0
    expect 1 "leave out --cuda-graphs" -- bench -m "$m" --device cuda --parallel 2 --cuda-graphs on
    expect 1 "not enough memory for bench --parallel 16: 16 histories of" -- \
      bench -m "$m" --device cuda --parallel 1,16 -d 100000000 -n 1
    expect 1 "head shards: 5 shards for 4 KV heads" -- bench decode --gpus 0,0,0,0,0
    expect 1 "head shards: device -1 is negative" -- bench decode --gpus 0,-1
    expect 1 "--cpu-share with --gpus of several shards" -- bench decode --gpus 0,0 --cpu-share 0.25
    # Tensor parallel (bench and generate --gpus): what the first version does not take, before the model loads.
    expect 1 "bench: --gpus cannot give pages to the CPU" -- bench -m "$m" --device cuda --gpus 0,0 --cpu-share 0.5
    expect 1 "bench: --gpus does not run --parallel rows yet" -- bench -m "$m" --device cuda --gpus 0,0 --parallel 2
    expect 1 "--gpus cannot give pages to the CPU" -- generate -m "$m" --device cuda --gpus 0,0 --cpu-share 0.5
    expect 1 "--gpus runs kernel by kernel: leave out --cuda-graphs on" -- generate -m "$m" --device cuda --gpus 0,0 --cuda-graphs on
    expect 1 "bench: --gpus runs kernel by kernel" -- bench -m "$m" --device cuda --gpus 0,0 --cuda-graphs on
    ;;
  bad_args)  # rejected by the same validators in generate and eval, before any work
    expect 1 "--gpus needs the GPU path (--device cuda)" -- generate --device cpu --gpus 0,1 -n 1
    expect 105 "--threads: Value 0 not in range" -- generate -t 0
    expect 105 "activekv: error: -n/--n-predict: Value abc is not a whole number" -- generate -n abc  # both names
    expect 105 "activekv: error: -d/--n-depth: 'abc' is not a token count" -- bench -d abc
    # --seed past 2^63 - 1 was saturated without a word (a README trial); -r past int: "Could not convert"
    expect 105 "--seed: Value 11611051477990640864 is not -1 or a whole number" -- generate --seed 11611051477990640864
    expect 105 "-r/--repetitions: Value 99999999999999999999 is not a whole number" -- bench -r 99999999999999999999
    expect 105 "--threads: Value 0 not in range" -- eval -t 0
    expect 105 "--synthetic-tokens: Value -1 not in range" -- eval --synthetic-tokens -1
    expect 105 "--layers-per-text: Value 0 not in range" -- eval --layers-per-text 0
    expect 105 "--page-size: Value 0 not in range" -- eval --page-size 0
    # Ranged flags say "not a (whole) number" for text, not "abc not in range" (a README trial),
    # and NONNEGATIVE ones no longer print DBL_MAX in full
    expect 105 "-t/--threads: Value abc is not a whole number" -- generate -t abc
    expect 105 "-c/--ctx-size: Value 1.5 is not a whole number" -- generate -c 1.5
    expect 105 "--gpu-kv-mem: Value abc is not a number" -- generate --gpu-kv-mem abc
    expect 105 "--gpu-kv-mem: Value -1 is negative" -- generate --gpu-kv-mem -1
    expect 105 "--gpu-kv-mem: Value 1e999 is too large" -- generate --gpu-kv-mem 1e999
    expect 105 "--gpu-kv-mem: the value is empty" -- generate --gpu-kv-mem ""
    expect 105 "--itl-target-ms: Value 5e9 not in range 0 to 3600000" -- serve --itl-target-ms 5e9
    expect 1 "eval: --routes: route 'hybrid:recent=x': 'recent=x' is not key=count" -- eval --routes hybrid:recent=x
    expect 1 "eval: --routes: exact is always scored as the baseline" -- eval --routes exact
    expect 1 "eval: --device must be cpu or cuda, got 'cuda-tc'" -- eval --device cuda-tc
    expect 1 "eval: --routes: route list: 'sink=2' continues no route" -- eval --routes sink=2,int8s
    expect 1 "eval: --int8s-kernel must be cpu, cuda or cuda-tc, got 'gpu'" -- eval --int8s-kernel gpu
    expect 1 "eval: --f32-activations is for --device cuda" -- eval --f32-activations
    expect 105 "--depths: Value 1.5 not in range" -- eval --passkey --depths 1.5
    expect 105 "--answer-tokens: Value 0 not in range" -- eval --passkey --answer-tokens 0
    expect 105 "--temp: Value inf is not a number" -- generate --temp inf -p hi -n 1
    expect 105 "--temp: Value nan is not a number" -- generate --temp nan -p hi -n 1
    expect 105 "--temp: Value 1e39 is too large" -- generate --temp 1e39 -p hi -n 1
    expect 105 "--top-p: Value inf is not a number" -- generate --top-p inf -p hi -n 1
    expect 105 "--top-p: Value 0 not in range (0, 1]" -- generate --top-p 0 -p hi -n 1
    expect 105 "--top-p: Value 1.5 not in range (0, 1]" -- generate --top-p 1.5 -p hi -n 1
    # Found by a helper breaking the CLI (session 23): bench -t 65536 crashed in OpenMP, --convert-threads
    # 100000 aborted, a negative passkey seed wrapped, an empty path meant "not given", and a flag of
    # eval's other mode was ignored without a word.
    expect 105 "-t/--threads: Value 65536 not in range 1 to 1024" -- bench --device cpu -t 65536
    expect 105 "--convert-threads: Value 100000 not in range 0 to 256" -- bench --convert-threads 100000
    expect 105 "--seed: Value -5 not in range" -- eval --passkey --seed -5
    expect 1 "eval --passkey: --scored applies to the perplexity eval, not --passkey" -- eval --passkey --scored 3
    expect 1 "eval: --seed applies to --passkey only" -- eval --seed 3
    expect 105 "--json: the value is empty" -- generate --json "" -p hi -n 1
    expect 105 "-m/--model: the value is empty" -- generate -m "" -p hi -n 1
    expect 105 "model: the value is empty" -- inspect ""
    expect 1 "eval: --scored 64 must be below the context -c 64" -- eval -c 64 --scored 64  # was "inconsistent sizes"
    expect 105 "--tile-pages: Value 99999999999 not in range 1 to 1048576" -- bench --tile-pages 99999999999
    ;;
  paths)  # output paths checked before the work and every write checked; a folder is not a prompt
    expect 1 "cannot write eval --json output '/nonexistent_dir/x.json': folder '/nonexistent_dir' does not exist" \
      -- eval --json /nonexistent_dir/x.json
    expect 1 "cannot write eval --json output '$TMP': it is a directory" -- eval --json "$TMP"
    expect 1 "cannot write gate --json output '/dev/full': write failed" -- gate --json /dev/full
    expect 1 "prompt file '$TMP' is a directory, not a file" -- generate -f "$TMP" -n 1
    expect 1 "cannot read prompt file '$TMP/missing.txt'" -- generate -f "$TMP/missing.txt" -n 1
    # An output that is also an input would replace it (a helper's -m m.gguf --json m.gguf lost the model)
    echo "a prompt" > "$TMP/p.txt"
    expect 1 "generate --json output '$TMP/p.txt' is also an input of this run" -- generate -f "$TMP/p.txt" --json "$TMP/p.txt" -n 1
    [ "$(cat "$TMP/p.txt")" = "a prompt" ] && echo "ok: the prompt file is unchanged" || fail "the prompt file was overwritten"
    echo '{"records": []}' > "$TMP/b.json"
    expect 1 "gate --json output '$TMP/b.json' is also an input of this run" -- gate --bench "$TMP/b.json" --json "$TMP/b.json"
    expect 1 "prompt file '/dev/zero' holds more than 268435456 bytes" -- generate -f /dev/zero -n 1  # not until memory ends
    # Every text is read before the first is scored: a missing second one fails before any scoring
    expect 1 "cannot read eval text file '$TMP/missing.txt'" -- eval -c 64 --scored 16 --page-size 16 \
      --layers-per-text 1 --query-rows 4 --synthetic-tokens 0 --routes int8s -t 2 --json "$TMP/e.json" \
      --texts tinyshakespeare.txt "$TMP/missing.txt"
    ;;
  memory)  # a history that cannot fit is refused before it is allocated, with sizes
    expect 1 "not enough memory for the KV page store of a 2000000000-token context" -- -c 2000000000 -p hi -n 1 -t 2
    expect 1 "bytes) asked," -- -c 2000000000 -p hi -n 1 -t 2
    ;;
  oom)  # an allocation that fails (here: under ulimit -v) is one line naming it, not "internal error"
    # Limits between the binary's own mappings and the weights with ACTIVEKV_CPU_WEIGHTS=f32
    # (513 MiB for the default model: as stored they are 92 MiB, under the binary's own
    # mappings); one thread, as failing to start OpenBLAS threads spins.
    named=0
    for kib in 450000 600000 800000; do
      out=$( (ulimit -v "$kib" && ACTIVEKV_CPU_WEIGHTS=f32 OMP_NUM_THREADS=1 timeout 60 "$AKV" -p hi -n 1 -t 1) 2>&1)
      if grep -q "internal error" <<<"$out"; then fail "ulimit -v $kib: $(tail -n 1 <<<"$out")"; fi
      if grep -q "error: out of memory allocating the weights of .* dequantised to fp32 (ACTIVEKV_CPU_WEIGHTS=f32): .* asked" <<<"$out"; then
        named=$((named + 1))
        echo "ok: ulimit -v $kib -> $(tail -n 1 <<<"$out" | cut -c1-120)..."
      fi
    done
    [ "$named" -gt 0 ] || fail "no ulimit -v in 450000..800000 KiB gave the weights' out-of-memory line"
    ;;
  end_of_text)  # a chat answer ends before -n: the summary says so
    expect 0 "stopped at end of text after" -- --chat -p "Reply with one word: hello" -n 128 --temp 0 -t 2
    # Stopped by -n mid-line, the text on stdout still ends its line (a README trial saw ctest's next
    # line glued to it), after the "[...] " that stands for the default prompt.
    "$AKV" generate -n 6 --temp 0 -t 2 > "$TMP/text.txt" 2> /dev/null || fail "generate -n 6 failed"
    if [ "$(head -c 6 "$TMP/text.txt")" != "[...] " ] || [ "$(tail -c 1 "$TMP/text.txt" | od -An -c | tr -d ' ')" != '\n' ]; then
      fail "generate's text does not start with '[...] ' and end with a newline: $(od -c "$TMP/text.txt" | tail -3)"
    else
      echo "ok: generate's text starts with '[...] ' and ends with a newline"
    fi
    ;;
  eval_table)  # a long text name widens the column instead of shifting the others
    long="$TMP/a-text-file-with-a-rather-long-name-for-the-eval-table.txt"
    head -c 20000 "$(dirname "$0")/../../data/texts/tinyshakespeare.txt" > "$long"
    if ! "$AKV" eval -c 128 --scored 16 --page-size 16 --layers-per-text 1 --query-rows 4 --synthetic-tokens 0 \
        --routes int8s -t 2 --texts "$long" --json "$TMP/eval.json" > "$TMP/table.txt" 2> "$TMP/log.txt"; then
      fail "short eval failed: $(tail -n 3 "$TMP/log.txt")"
    else
      # Rows of one text are as long as the header; the "all" rows lack the
      # last two columns (MiB/step, bitwise: 11 + 9 characters).
      awk 'NF == 0 { next }
           $1 == "route" { h = length($0); next }
           $2 == "all" { if (length($0) != h - 20) bad = bad "\n  " $0; next }
           { if (length($0) != h) bad = bad "\n  " $0 }
           END { if (!h) { print "no table header"; exit 1 } if (bad != "") { print "misaligned rows:" bad; exit 1 } }' \
        "$TMP/table.txt" || fail "eval table columns do not align: $(cat "$TMP/table.txt")"
      [ -s "$TMP/eval.json" ] || fail "eval did not write $TMP/eval.json"
      python3 - "$TMP/eval.json" <<'PY' || fail "eval JSON lacks where the model ran: $(head -c 400 "$TMP/eval.json")"
import json, sys
for r in json.load(open(sys.argv[1])):
    assert r["device"] == "cpu" and r["placement"] is None and r["activations"] == "f32", r
    assert r["int8s_kernel"] == "cpu", r
PY
      echo "ok: eval table aligned with a ${#long}-character text path"
    fi
    ;;
  inspect)  # inspect --tensor-parallel N: what each GPU would hold, or why the model does not split so
    m=$(tiny_model)  # 2 KV heads x 2 query heads of 64, FFN 512 (Q4_0), vocabulary 512
    expect 0 "GPU 1: KV head 1, query heads 2-3, FFN rows 256-511, output rows 256-511" -- \
      inspect "$m" --tensor-parallel 2
    expect 0 "does not split: tensor parallel: 3 GPUs for 2 KV heads" -- inspect "$m" --tensor-parallel 3
    expect 105 "--tensor-parallel: Value 0 not in range" -- inspect "$m" --tensor-parallel 0
    expect 0 "SmolLM2-135M-Instruct.Q4_1.gguf" -- inspect  # no model named: the default one, as generate
    ;;
  passkey)  # eval --passkey on the default model at a tiny context: the table and the JSON's fields
    if ! "$AKV" eval --passkey -c 256 --page-size 32 --depths 0.2,0.8 --seed 5 --answer-tokens 4 \
        --routes int8s,hybrid:recent=1,sink=2 -t 2 --json "$TMP/pk.json" > "$TMP/table.txt" 2> "$TMP/log.txt"; then
      fail "passkey failed: $(tail -n 3 "$TMP/log.txt")"
    else
      python3 - "$TMP/pk.json" <<'PY' || fail "passkey JSON: $(head -c 400 "$TMP/pk.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["check"] == "passkey" and d["context"] == 256 and d["seed"] == 5 and d["depths"] == [0.2, 0.8], d
assert [r["format"] for r in d["records"]] == ["exact", "int8s", "hybrid:recent=1,sink=2"] * 2, d["records"]
assert all(len(r["key"]) == 5 and isinstance(r["retrieved"], bool) for r in d["records"])
assert [s["format"] for s in d["summary"]] == ["exact", "int8s", "hybrid:recent=1,sink=2"]
assert d["device"] == "cpu" and d["placement"] is None and d["activations"] == "f32", d
PY
      grep -q "retrieval" "$TMP/table.txt" || fail "passkey table lacks the summary: $(cat "$TMP/table.txt")"
      echo "ok: eval --passkey table and JSON"
    fi
    ;;
  auto_device)  # --device auto that ends on the CPU says why in the summary; --device cpu needs no reason
    for dev in auto cpu; do
      if ! "$AKV" generate --device $dev -p hi -n 2 -t 2 --json "$TMP/$dev.json" > /dev/null 2> "$TMP/log.txt"; then
        fail "generate --device $dev failed: $(tail -n 3 "$TMP/log.txt")"
        continue
      fi
      python3 - "$TMP/$dev.json" $dev <<'PY' && echo "ok: --device $dev: the summary's device line" \
        || fail "--device $dev: the device line: $(grep device "$TMP/$dev.json")"
import json, sys
device, asked = json.load(open(sys.argv[1]))["device"], sys.argv[2]
if asked == "cpu":
    assert "--device auto" not in device, device
elif device.startswith("cpu"):  # a GPU machine runs on the GPU: nothing to explain there
    assert "; --device auto: " in device, device
    assert "no CUDA backend" in device or "cudaGetDeviceCount" in device, device
PY
    done
    ;;
  cpu_only)  # what a build without the CUDA backend says when asked for the GPU
    expect 1 "--device cuda: this activekv was built without the CUDA backend" -- generate --device cuda -p hi -n 1
    expect 1 "eval: --device cuda: this build has no CUDA backend" -- eval --device cuda
    expect 1 "eval: --int8s-kernel cuda-tc: this build has no CUDA backend" -- eval --int8s-kernel cuda-tc
    expect 1 "bench decode: this activekv was built without the CUDA backend" -- bench decode
    expect 1 "--device cuda: this activekv was built without the CUDA backend" -- bench --device cuda -m "$(tiny_model)"
    expect 1 "calibrate: this activekv was built without the CUDA backend" -- calibrate
    ;;
  *)
    echo "unknown case '$CASE'" >&2
    exit 2
    ;;
esac
[ "$failures" = 0 ] || { echo "$failures check(s) failed" >&2; exit 1; }
