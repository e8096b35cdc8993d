#!/usr/bin/env bash
# One device call: build the CUDA backend (standalone CMake project, needs only
# the CUDA toolkit + CMake), run the GPU tests, calibrate + bench decode, the
# PyTorch peers and the plot. Everything lands in $OUT.
#
#   AKV_COMMIT=$(git rev-parse HEAD) scripts/device_run.sh check|quick|full|model
#
# Phase `model` builds the WHOLE project (CPU code + CUDA backend) instead and
# runs every GPU test, including the `--device cuda` greedy-token test on the
# tiny llama GGUF. The device image lacks our Debian libraries: fetch them here
# into .debs/ (ignored via .git/info/exclude) and carry it, with the gguf wheel
# in .whl/ for tools/make_tiny_llama_gguf.py:
#
#   (mkdir -p .debs && cd .debs && apt-get download libopenblas0-openmp libopenblas-openmp-dev \
#      libopenblas-dev libgfortran5 libicu72 libicu-dev libfmt9 libfmt-dev libcli11-dev \
#      nlohmann-json3-dev libgtest-dev)
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#      --platform manylinux_2_28_x86_64 -d .whl gguf==0.19.0
#   run: scripts/device_run.sh model   (carry: .debs, .whl)
#
# The packages are unpacked with dpkg -x into a prefix (never /), named to
# CMake with CMAKE_PREFIX_PATH (our OpenBLAS search is prefix-aware).
set -uo pipefail
OUT=${OUT:-/tmp/activekv-out}
mkdir -p "$OUT"
PHASE=${1:-quick}
COMMIT=${AKV_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
exec > >(tee -a "$OUT/run.log") 2>&1
echo "== device_run.sh $PHASE, commit $COMMIT, $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv
if [ "$PHASE" = model ]; then
  t0=$(date +%s)
  grep PRETTY_NAME /etc/os-release; ldd --version | head -1; c++ --version | head -1; nvcc --version | tail -1
  PFX=/tmp/akv-prefix; ARCH=x86_64-linux-gnu
  for f in .debs/*.deb; do dpkg -x "$f" "$PFX" || exit 1; done
  if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  export LD_LIBRARY_PATH=$PFX/usr/lib/$ARCH:$PFX/usr/lib/$ARCH/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PFX/usr" \
    -DACTIVEKV_BUILD_BENCHMARKS=OFF > "$OUT/cmake.log" 2>&1 \
    && cmake --build build-device -j 16 --target test_cuda_decode test_cuda_model activekv >> "$OUT/cmake.log" 2>&1 \
    || { tail -60 "$OUT/cmake.log"; exit 1; }
  echo "== whole-project build ok in $(( $(date +%s) - t0 )) s"
  echo "== GPU tests (ctest -L gpu: kernels, prefill, the tiny GGUF fixture, --device cuda greedy tokens)"
  (cd build-device && ctest -L gpu --output-on-failure --output-junit "$OUT/ctest_gpu.xml")
  TEST_RC=$?
  echo "== ctest rc=$TEST_RC"
  build-device/bin/test_cuda_model --gtest_output=json:"$OUT/gtest_model.json" | grep -E "page |OK|FAILED|PASSED"
  build-device/bin/activekv generate --help | grep -A1 -- --device
  echo "== done in $(( $(date +%s) - t0 )) s"
  exit $TEST_RC
fi
GTEST_ARG=""
[ -d third_party_carry/googletest ] && GTEST_ARG="-DACTIVEKV_GTEST_SRC=$PWD/third_party_carry/googletest"
t0=$(date +%s)
cmake -S src/cuda -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release $GTEST_ARG > "$OUT/cmake.log" 2>&1 \
  && cmake --build build-cuda -j 16 >> "$OUT/cmake.log" 2>&1 || { tail -40 "$OUT/cmake.log"; exit 1; }
echo "== build ok in $(( $(date +%s) - t0 )) s"

echo "== GPU tests"
build-cuda/bin/test_cuda_decode --gtest_output=json:"$OUT/gtest.json"
TEST_RC=$?
echo "== tests rc=$TEST_RC"

if [ "$PHASE" = check ]; then
  # Kernel check: resident only, two split sizes, then memcheck; no peers.
  for SPL in 512 1024; do
    echo "== resident, split $SPL"
    build-cuda/bin/activekv-bench decode --contexts 32k,128k --batches 1,4 --steps 10 --warmup 3 --modes resident \
      --split $SPL --json "$OUT/bench_check_split$SPL.json" --profile "" --commit "$COMMIT" | grep -E "resident|GB/s"
  done
  echo "== compute-sanitizer memcheck on the GPU tests"
  timeout 150 compute-sanitizer --tool memcheck --print-limit 5 build-cuda/bin/test_cuda_decode 2>&1 | tail -6
  echo "== done in $(( $(date +%s) - t0 )) s"
  exit 0
fi
if [ "$PHASE" = quick ]; then
  CTX=32k,128k; BATCH=1,4; STEPS=5; WARM=2; MODES=streamed,resident,streamed-whole
else
  CTX=32k,64k,128k; BATCH=1,4; STEPS=20; WARM=3; MODES=streamed,resident,streamed-whole
fi
CMD="activekv-bench decode --contexts $CTX --batches $BATCH --steps $STEPS --warmup $WARM --modes $MODES"
echo "== $CMD"
build-cuda/bin/activekv-bench decode --contexts $CTX --batches $BATCH --steps $STEPS --warmup $WARM \
  --modes $MODES --json "$OUT/bench_decode.json" --profile "$OUT/profile.json" --commit "$COMMIT"
echo "== bench rc=$?"
echo "== peers"
PYTHONUNBUFFERED=1 python3 bench/peers_torch.py --contexts $CTX --batches $BATCH --steps $STEPS --warmup $WARM \
  --profile "$OUT/profile.json" --json "$OUT/peers.json" --commit "$COMMIT"
echo "== peers rc=$?"
python3 bench/plot_decode.py "$OUT/bench_decode.json" "$OUT/peers.json" -o "$OUT/decode.png"
if [ "$PHASE" = full ]; then
  echo "== resident kernel with 1024-token splits (variant, log + JSON)"
  build-cuda/bin/activekv-bench decode --contexts 32k,128k --batches 1,4 --steps 20 --warmup 3 --modes resident \
    --split 1024 --json "$OUT/bench_split1024.json" --profile "" --commit "$COMMIT" | tail -8
  echo "== compute-sanitizer memcheck on the GPU tests"
  timeout 120 compute-sanitizer --tool memcheck --print-limit 5 build-cuda/bin/test_cuda_decode 2>&1 | tail -6
fi
echo "== done in $(( $(date +%s) - t0 )) s"
