#!/usr/bin/env bash
# Runs the test suites (after scripts/setup.sh). What CI runs, via .ci/run.
#   1. The GGUF reader's tests under ASan+UBSan (build-asan/).
#   2. The concurrency tests (background conversion) under ThreadSanitizer (build-tsan/).
#   3. The GGUF fuzz target under libFuzzer+ASan+UBSan for FUZZ_SECONDS (default 60).
#   4. The whole project without the CUDA backend (build-nocuda/, -DACTIVEKV_CUDA=OFF:
#      what a machine without nvcc builds), its CLI tests and a short generate.
#   5. ctest on the Release build (build/, CUDA on where nvcc is), GPU-labelled tests excluded.
# Set QUICK=1 to run only step 5.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

cmake --build build --parallel "$jobs"

if [ "${QUICK:-0}" != 1 ]; then
  echo "[test] GGUF reader under ASan+UBSan" >&2
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DACTIVEKV_SANITIZE=address -DACTIVEKV_CUDA=OFF >/dev/null
  cmake --build build-asan --parallel "$jobs" --target test_gguf
  build-asan/bin/test_gguf --gtest_brief=1
  echo "[test] background conversion under TSan" >&2
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DACTIVEKV_SANITIZE=thread -DACTIVEKV_CUDA=OFF >/dev/null
  cmake --build build-tsan --parallel "$jobs" --target test_convert test_route
  # OpenMP off here: GCC's libgomp is not TSan-instrumented, so its barriers
  # read as races; the pool's std::threads are what this run checks.
  export OMP_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1
  build-tsan/bin/test_convert --gtest_brief=1
  build-tsan/bin/test_route --gtest_brief=1
  unset OMP_NUM_THREADS TSAN_OPTIONS
  echo "[test] GGUF fuzz target, ${FUZZ_SECONDS:-60} s" >&2
  scripts/fuzz.sh "${FUZZ_SECONDS:-60}"
  echo "[test] CPU-only build (ACTIVEKV_CUDA=OFF)" >&2
  cmake -S . -B build-nocuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DACTIVEKV_CUDA=OFF >/dev/null
  cmake --build build-nocuda --parallel "$jobs"  # every target, the test binaries included
  build-nocuda/bin/activekv --help >/dev/null
  build-nocuda/bin/activekv -p "The capital of France is" -n 8 --temp 0 -t "$jobs"
  ctest --test-dir build-nocuda --output-on-failure -L cli -j "$jobs"
fi

# ctest last, so that its summary closes the log.
echo "[test] ctest on the Release build (GPU-labelled tests excluded; the longest step)" >&2
ctest --test-dir build --output-on-failure --label-exclude gpu -j "$jobs"
