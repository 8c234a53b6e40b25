#!/usr/bin/env bash
# Builds the MindSpore AOT shim (no MindSpore headers needed: the AOT signature is plain C) and
# lays out the importable package:  OUT/hccn_ms/__init__.py  OUT/hccn_ms/_hccn_ms_aot.so
#
# Usage: bindings/mindspore/build.sh [--lib LIBDIR] [--out OUT]
#   --lib  where libhccn.so is (default target/release); linked with an rpath to it
#   --out  where to put the package (default bindings/mindspore/build)
# Then: PYTHONPATH=OUT hccnrun -n 2 /opt/hccn/venvs/mindspore/bin/python train.py
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

lib=$root/target/release
out=$here/build
while [ $# -gt 0 ]; do
  case $1 in
    --lib) lib=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -f "$lib/libhccn.so" ] || { echo "build.sh: no libhccn.so in $lib (cargo build --release)" >&2; exit 1; }
lib=$(cd "$lib" && pwd)

mkdir -p "$out/hccn_ms"
g++ -std=c++17 -O2 -shared -fPIC -Wall -Wextra -Werror -I"$root/include" \
  "$here/hccn_ms_aot.cc" -o "$out/hccn_ms/_hccn_ms_aot.so.tmp" -L"$lib" -lhccn -Wl,-rpath,"$lib"
mv "$out/hccn_ms/_hccn_ms_aot.so.tmp" "$out/hccn_ms/_hccn_ms_aot.so"
cp "$here/hccn_ms/__init__.py" "$out/hccn_ms/__init__.py"
echo "build.sh: $out/hccn_ms ready (PYTHONPATH=$out)"
