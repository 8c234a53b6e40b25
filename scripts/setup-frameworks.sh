#!/usr/bin/env bash
# Creates the virtualenvs for the TensorFlow and MindSpore bindings, once, with pinned
# versions: /opt/hccn/venvs/tf and /opt/hccn/venvs/mindspore. A venv whose pinned packages
# already import is reused, so later runs return in a few seconds.
# Usage: scripts/setup-frameworks.sh [tf|mindspore|all]   (default: all)
set -euo pipefail

TF_VERSION=2.21.0          # tensorflow-cpu
MINDSPORE_VERSION=2.10.0   # CPU+Ascend wheel; used on CPU here
# MindSpore 2.10's extension modules are built against NumPy 1.x: with NumPy 2 (what pip picks
# by default) its autodiff path prints import errors and reports "Numpy init failed".
MINDSPORE_NUMPY=1.26.4
VENVS=/opt/hccn/venvs
# Debian's interpreter: the frameworks' wheels are built for the system glibc/libstdc++.
PY=${PYTHON:-/usr/bin/python3}

which_one=${1:-all}

ensure_python() {
  if ! "$PY" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    echo "setup-frameworks: installing python3-venv"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends python3 python3-venv
  fi
}

# make_venv NAME CHECK PACKAGES...: CHECK is Python code that succeeds when the venv is ready.
make_venv() {
  local name=$1 check=$2
  shift 2
  local dir=$VENVS/$name
  if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "$check" >/dev/null 2>&1; then
    echo "setup-frameworks: $dir ready"
    return 0
  fi
  ensure_python
  echo "setup-frameworks: creating $dir with $*"
  local start=$SECONDS
  mkdir -p "$VENVS"
  "$PY" -m venv "$dir"
  "$dir/bin/python" -m pip install --quiet --upgrade pip
  "$dir/bin/python" -m pip install --quiet "$@"
  "$dir/bin/python" -c "$check"
  echo "setup-frameworks: $dir done in $((SECONDS - start)) s, $(du -sh "$dir" | cut -f1)"
}

case $which_one in
  tf | all)
    make_venv tf \
      "import os; os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'; import tensorflow as tf; assert tf.__version__ == '$TF_VERSION'" \
      "tensorflow-cpu==$TF_VERSION"
    ;;&
  mindspore | all)
    make_venv mindspore \
      "import numpy, mindspore as ms; assert ms.__version__ == '$MINDSPORE_VERSION' and numpy.__version__ == '$MINDSPORE_NUMPY'" \
      "mindspore==$MINDSPORE_VERSION" "numpy==$MINDSPORE_NUMPY"
    ;;
  tf) ;;
  *)
    echo "usage: $0 [tf|mindspore|all]" >&2
    exit 2
    ;;
esac
