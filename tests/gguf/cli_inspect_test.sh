#!/usr/bin/env bash
# CLI checks of GGUF errors (ctest cli_gguf_errors): a bad file makes
# `activekv inspect` print one error line naming the file and nothing on
# stdout (it used to print the report's first lines, then fail), and
# `generate -m` names the file it could not read.
#   usage: cli_inspect_test.sh ACTIVEKV_BINARY MODEL_GGUF
set -uo pipefail
bin="$1"
model="$2"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
failures=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# Runs "$@" and checks: exit status $want_rc, stdout empty (when $want_rc is
# 1), stderr one line containing every $needles entry.
expect() {
  local want_rc="$1"; shift
  "$@" >"$dir/out" 2>"$dir/err"
  local rc=$?
  [ "$rc" = "$want_rc" ] || fail "$* exited $rc, expected $want_rc; stderr: $(cat "$dir/err")"
  if [ "$want_rc" = 1 ]; then
    [ -s "$dir/out" ] && fail "$* printed to stdout before failing: $(head -3 "$dir/out")"
    [ "$(wc -l <"$dir/err")" = 1 ] || fail "$* stderr is not one line: $(cat "$dir/err")"
  fi
  for n in "${needles[@]}"; do
    grep -qF -- "$n" "$dir/err" "$dir/out" || fail "$* output lacks '$n': $(cat "$dir/err")"
  done
}

# A text file: "bad magic" alone did not say which file.
printf 'root:x:0:0:root:/root:/bin/bash\n' >"$dir/passwd"
needles=("GGUF: $dir/passwd: bad magic")
expect 1 "$bin" inspect "$dir/passwd"
expect 1 "$bin" generate -m "$dir/passwd" -p hi -n 1

# Valid header, general.architecture typed UINT32 (gguf.md: STRING). Before
# the reader checked the type, inspect printed "file ..." and "GGUF ..." first.
{
  printf 'GGUF\x03\x00\x00\x00'                       # magic, version 3
  printf '\x00\x00\x00\x00\x00\x00\x00\x00'           # tensor_count 0
  printf '\x01\x00\x00\x00\x00\x00\x00\x00'           # kv_count 1
  printf '\x14\x00\x00\x00\x00\x00\x00\x00general.architecture'
  printf '\x04\x00\x00\x00\x07\x00\x00\x00'           # UINT32 7
} >"$dir/arch_u32.gguf"
needles=("$dir/arch_u32.gguf" "general.architecture must be of type STRING (gguf.md), not UINT32")
expect 1 "$bin" inspect "$dir/arch_u32.gguf"
# generate read the tokenizer first and blamed the missing tokenizer keys.
expect 1 "$bin" generate -m "$dir/arch_u32.gguf" -p hi -n 1

# A valid GGUF that is no runnable model: the report, and why it cannot run.
{
  printf 'GGUF\x03\x00\x00\x00'
  printf '\x00\x00\x00\x00\x00\x00\x00\x00'
  printf '\x01\x00\x00\x00\x00\x00\x00\x00'
  printf '\x14\x00\x00\x00\x00\x00\x00\x00general.architecture'
  printf '\x08\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00llama'  # STRING "llama"
} >"$dir/no_hparams.gguf"
needles=("arch       llama" "model: not runnable here: model config: llama.block_count is missing (required)")
expect 0 "$bin" inspect "$dir/no_hparams.gguf"

needles=("layers 30, d_model 576" "RoPE base 100000")
expect 0 "$bin" inspect "$model"

if [ "$failures" != 0 ]; then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "all CLI GGUF error checks passed"
