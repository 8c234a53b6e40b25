#!/usr/bin/env bash
# Creates the Python virtualenvs that the binding tests and examples use, each framework in its
# own so their numpy pins never clash, and installs the hccn package (bindings/python, with the
# built library and tools inside it) into each. Idempotent: a venv whose pinned packages are
# already there is only refreshed with the current package (a few seconds).
#
#   scripts/setup-python.sh torch    # /opt/hccn/venvs/torch: torch + numpy + torchft from PyPI (~5.4 GB, ~3-5 min)
#   scripts/setup-python.sh all      # every venv this script knows
#
# Run after `cargo build --release -p hccn-capi -p hccn-tools` (else it builds them): the package
# carries the library and the tools.
set -euo pipefail
cd "$(dirname "$0")/.."

VENVS=/opt/hccn/venvs
TORCH_PIN="torch==2.15.0"
NUMPY_PIN="numpy==2.4.6"
SETUPTOOLS_PIN="setuptools==84.2.1"  # builds the hccn package (--no-build-isolation)
TORCHFT_PIN="torchft==0.2.0"  # hccn.torchft is built against this version's internals (and brings torchft_lighthouse)

# Sets PY to a python3 that can make virtualenvs, installing Debian's when there is none.
python_for_venvs() {
  PY=$(command -v python3 || true)
  if [ -z "$PY" ] || ! "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    echo "setup-python: installing python3 and python3-venv"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends python3 python3-venv python3-pip
    PY=$(command -v python3)
  fi
}

# has VENV PIN...: true when every `name==version` pin is installed in VENV.
has() {
  local venv=$1
  shift
  [ -x "$venv/bin/python" ] || return 1
  "$venv/bin/python" - "$@" <<'PY'
import sys
from importlib.metadata import version, PackageNotFoundError
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    try:
        if version(name) != want:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
PY
}

install_hccn() {
  local venv=$1
  # The package carries the library and the tools (bindings/python/setup.py).
  local f
  for f in libhccn.so hccnrun hccn-perf hccn-trace hccn-info; do
    [ -f "target/release/$f" ] || { cargo build --release -p hccn-capi -p hccn-tools; break; }
  done
  "$venv/bin/pip" install -q --no-deps --no-build-isolation --force-reinstall ./bindings/python
  rm -rf bindings/python/build bindings/python/hccn.egg-info
}

setup_torch() {
  local venv=$VENVS/torch
  if ! has "$venv" "$TORCH_PIN" "$NUMPY_PIN"; then
    python_for_venvs
    echo "setup-python: creating $venv ($TORCH_PIN, $NUMPY_PIN; about 5.4 GB, a few minutes)"
    mkdir -p "$VENVS"
    [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "$TORCH_PIN" "$NUMPY_PIN" "$SETUPTOOLS_PIN"
  fi
  if ! has "$venv" "$TORCHFT_PIN"; then
    echo "setup-python: installing $TORCHFT_PIN into $venv"
    # Its own dependencies (OpenTelemetry) come along; torch is pinned above and stays as it is.
    "$venv/bin/pip" install -q --disable-pip-version-check "$TORCHFT_PIN" "$TORCH_PIN"
  fi
  install_hccn "$venv"
  # hccn.torch's C++ extension, compiled against this venv's torch into the installed package
  # (1.5-3 minutes on 2 cores; skipped when neither its sources nor torch changed).
  "$venv/bin/python" bindings/python/build_torch_ext.py --install
  echo "setup-python: $venv ready"
}

case "${1:-all}" in
  torch) setup_torch ;;
  all) setup_torch ;;
  *)
    echo "usage: scripts/setup-python.sh <torch|all>" >&2
    exit 2
    ;;
esac
