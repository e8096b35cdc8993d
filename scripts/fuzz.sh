#!/usr/bin/env bash
# Fuzzes the GGUF reader with libFuzzer + ASan + UBSan.
#
# Usage: scripts/fuzz.sh [SECONDS]   (default 60)
#
# Builds only the gguf_fuzz target with clang in build-fuzz/, copies the seed
# corpus (fuzz/corpus/gguf, written by tools/make_gguf_fixtures.py) to a temp
# dir so the committed corpus is never modified, and runs for SECONDS.
# Exits non-zero if the fuzzer finds a crash; the reproducer is left in
# build-fuzz/artifacts/ (re-run it with: build-fuzz/fuzz/gguf_fuzz <file>).
set -euo pipefail

seconds="${1:-60}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build-fuzz"

cmake -S "$root" -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DACTIVEKV_BUILD_FUZZERS=ON -DACTIVEKV_BUILD_TESTS=OFF -DACTIVEKV_BUILD_BENCHMARKS=OFF -DACTIVEKV_CUDA=OFF \
  -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang
cmake --build "$build" --target gguf_fuzz

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus" "$build/artifacts"
cp "$root"/fuzz/corpus/gguf/* "$work/corpus/"

# -rss_limit_mb catches allocations driven by bogus counts; 16 KiB inputs
# are enough to hold every seed and still keep executions fast.
"$build/fuzz/gguf_fuzz" \
  -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=16384 -timeout=10 \
  -artifact_prefix="$build/artifacts/" -print_final_stats=1 \
  "$work/corpus"
