#!/usr/bin/env bash
# `activekv serve` with clients we did not write: the `openai` Python package
# (streaming and not) and curl. The package goes into a venv under the build
# folder (cached: later runs reuse it). Without PyPI the test is skipped
# (exit 77, ctest's SKIP_RETURN_CODE), saying so.
#   openai_client_test.sh ACTIVEKV VENV_DIR
set -uo pipefail
BIN=$1
VENV=$2
here=$(cd "$(dirname "$0")" && pwd)
if ! "$VENV/bin/python" -c "import openai" 2>/dev/null; then
  rm -rf "$VENV"
  python3 -m venv "$VENV" || { echo "SKIP: python3 -m venv failed (Debian: python3-venv)"; exit 77; }
  if ! timeout 300 "$VENV/bin/pip" install --quiet --disable-pip-version-check "openai>=1.40,<2"; then
    echo "SKIP: could not install the openai package from PyPI (offline?)"
    rm -rf "$VENV"
    exit 77
  fi
fi
command -v curl >/dev/null || { echo "SKIP: curl is not installed"; exit 77; }
exec "$VENV/bin/python" "$here/openai_client_test.py" "$BIN"
