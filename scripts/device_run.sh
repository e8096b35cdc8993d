#!/usr/bin/env bash
# One device call on the GPU machine: build the whole project, run every GPU
# test, then the measurements of the compressed formats (issue 5) and the
# exact tier. Everything lands in $OUT (at most 8 files come back: run.log,
# gtest_{decode,formats,model}.json and the phase's results).
#
#   AKV_COMMIT=$(git rev-parse HEAD) scripts/device_run.sh full|tests|eval
#
# AKV_COMMIT: the full commit the tree is at (the copied tree's .git may be
# missing or stale); it is recorded in every JSON written here.
#
#   tests  build + GPU tests
#   full   + the int8s kernel switches' speed, bench decode over every
#          kv-format (streamed, resident), PyTorch peers, plot, gate (with the
#          committed evals), compute-sanitizer on the format tests
#   eval   the eval with the GPU int8s kernel (needs the model parts, below)
#          and the gate on it
#
# The device image lacks our Debian libraries: fetch them here into .debs/
# (ignored via .git/info/exclude) and carry it, with the gguf wheel in .whl/
# (tools/make_tiny_llama_gguf.py); the eval texts travel with the tree (data/texts/):
#
#   (mkdir -p .debs && cd .debs && apt-get download libopenblas0-openmp libopenblas-openmp-dev \
#      libopenblas-dev libgfortran5 libicu72 libicu-dev libfmt9 libfmt-dev libcli11-dev \
#      nlohmann-json3-dev libgtest-dev)
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#      --platform manylinux_2_28_x86_64 -d .whl gguf==0.19.0
#   run: scripts/device_run.sh full   (carry: .debs, .whl)
#
# The default model (98 MB) is over one call's 64 MiB carry. To run the eval
# with the GPU int8s kernel, send it first in two calls on the same warm
# machine (split -n 2 models/*.gguf .mp/part_ ; carry .mp/part_aa, then
# .mp/part_ab, each call: mkdir -p /tmp/akv-model && cp .mp/part_* /tmp/akv-model/).
# This script joins the parts and checks the sha256; without them it skips the eval.
#
# The packages are unpacked with dpkg -x into a prefix (never /), named to
# CMake with CMAKE_PREFIX_PATH (our OpenBLAS search is prefix-aware).
set -uo pipefail
OUT=${OUT:-/tmp/activekv-out}
mkdir -p "$OUT"
PHASE=${1:-full}
COMMIT=${AKV_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
export AKV_COMMIT=$COMMIT  # what `activekv eval` records (the tree's .git may be stale there)
MODEL_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
exec > >(tee -a "$OUT/run.log") 2>&1
echo "== device_run.sh $PHASE, commit $COMMIT, $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv
t0=$(date +%s)
PFX=/tmp/akv-prefix; ARCH=x86_64-linux-gnu
[ -d "$PFX/usr" ] || for f in .debs/*.deb; do dpkg -x "$f" "$PFX" || exit 1; done
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export LD_LIBRARY_PATH=$PFX/usr/lib/$ARCH:$PFX/usr/lib/$ARCH/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PFX/usr" \
  > /tmp/cmake.log 2>&1 \
  && cmake --build build-device -j 16 \
     >> /tmp/cmake.log 2>&1 || { tail -60 /tmp/cmake.log; exit 1; }
echo "== whole-project build ok in $(( $(date +%s) - t0 )) s"
AKV=build-device/bin/activekv

echo "== GPU tests: every gpu binary, GoogleTest JSON with the commit and command recorded in it"
(cd build-device && ctest -R cuda_model_fixture --output-on-failure > /dev/null)  # the tiny GGUF of test_cuda_model
TEST_RC=$?
for T in decode formats model model_ops weights; do
  JSON="$OUT/gtest_$T.json"
  CMD="build-device/bin/test_cuda_$T --gtest_output=json:$JSON"
  $CMD | grep -E "^  |OK|FAILED|PASSED|SKIPPED"
  RC=${PIPESTATUS[0]}
  [ "$RC" = 0 ] || TEST_RC=$RC
  [ -f "$JSON" ] && python3 -c 'import json, sys
p, commit, command = sys.argv[1:4]
d = json.load(open(p)); d["commit"] = commit; d["command"] = command
json.dump(d, open(p, "w"), indent=2)' "$JSON" "$COMMIT" "$CMD"
done
echo "== GPU tests rc=$TEST_RC"
[ "$PHASE" = tests ] && exit $TEST_RC

if [ "$PHASE" = eval ]; then
EVAL_JSON=bench/results/eval-SmolLM2-135M-Instruct.Q4_1.json
if ls /tmp/akv-model/part_* > /dev/null 2>&1; then
  mkdir -p models && cat /tmp/akv-model/part_* > models/SmolLM2-135M-Instruct.Q4_1.gguf
  if echo "$MODEL_SHA  models/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c --quiet; then
    echo "== eval with the GPU int8s kernel on the own-format samples"
    $AKV eval -m models/SmolLM2-135M-Instruct.Q4_1.gguf --device cuda --routes int8s,hybrid \
      -t 16 --json "$OUT/eval_gpu.json" 2>&1 | grep -vE "^\[eval .*score [0-9]+ tokens"
    EVAL_JSON="$OUT/eval_gpu.json"
  else
    echo "== model parts do not match sha256 $MODEL_SHA: eval skipped"
  fi
else
  echo "== no model parts in /tmp/akv-model: eval with the GPU kernel skipped"
fi
echo "== gate"
$AKV gate --bench bench/results/h200_bench_formats.json --eval bench/results/eval-SmolLM2-135M-Instruct.Q4_1.json \
  "$EVAL_JSON" --json "$OUT/gate.json"
  echo "== done in $(( $(date +%s) - t0 )) s"
  exit $TEST_RC
fi
CTX=8k,16k,32k,64k,128k; BATCH=1,2; STEPS=10; WARM=2
echo "== int8s kernel switches (SPEC 4 tricks), resident device time"
for SW in "" "--no-tensor-cores" "--no-skip-unit-rescale" "--pow2-reference" "--query-terms 1"; do
  echo "-- switches: ${SW:-default}"
  $AKV bench decode --contexts 32k,128k --batches 1 --kv-format int8s --modes resident --steps 10 --warmup 2 \
    $SW --json "/tmp/tricks.json" --profile "" --commit "$COMMIT" | grep -E "^  int8s +resident"
done
echo "== compute-sanitizer memcheck, format tests"
timeout 240 compute-sanitizer --tool memcheck --print-limit 5 build-device/bin/test_cuda_formats \
  --gtest_filter='FormatRoutes.*:Lossless13Unpack.*' 2>&1 | tail -4

echo "== bench decode: every kv-format, streamed + resident"
$AKV bench decode --contexts $CTX --batches $BATCH --kv-format bf16,lossless13,int8s,hybrid \
  --modes streamed,resident --steps $STEPS --warmup $WARM --json "$OUT/bench_formats.json" \
  --profile /tmp/profile.json --commit "$COMMIT"
echo "== bench rc=$?"
echo "== peers (PyTorch, same run)"
PYTHONUNBUFFERED=1 python3 bench/peers_torch.py --contexts $CTX --batches $BATCH --steps $STEPS --warmup $WARM \
  --profile /tmp/profile.json --json "$OUT/peers.json" --commit "$COMMIT"
python3 bench/plot_decode.py "$OUT/bench_formats.json" "$OUT/peers.json" -o "$OUT/decode_formats.png"

if [ "$PHASE" = full ]; then
  echo "== prefill attention, 27B shape (chunks 512/2048 at depth 0/32K/128K)"
  build-device/bin/bench_prefill_attention --iters 5 --warmup 2 --commit "$COMMIT" --json "$OUT/bench_prefill.json"
  echo "== weight matvec vs the HBM read floor (issue 10: >= 75 % for Q4_0 Q4_K Q6_K Q8_0 at n_vec 1)"
  build-device/bin/bench_matvec --json "$OUT/bench_matvec.json"
  echo "== gate (quality: the committed CPU and GPU evals)"
  $AKV gate --bench "$OUT/bench_formats.json" --json "$OUT/gate.json"  # default --eval: the committed CPU + GPU evals
  $AKV gate --bench "$OUT/bench_formats.json" --batch 2 | tail -3
  echo "== done in $(( $(date +%s) - t0 )) s"
  exit $TEST_RC
fi
