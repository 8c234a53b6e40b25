#!/usr/bin/env bash
# Builds the hccn TensorFlow op library against the tensorflow-cpu of a Python environment,
# with tf.sysconfig's compile and link flags (as Horovod does), and lays out the importable
# package:  OUT/hccn_tf/__init__.py  OUT/hccn_tf/keras/  OUT/hccn_tf/_hccn_tf_ops.so
#
# Usage: bindings/tensorflow/build.sh [--python PY] [--lib LIBDIR] [--out OUT]
#   --python  the interpreter with tensorflow (default /opt/hccn/venvs/tf/bin/python)
#   --lib     where libhccn.so is (default target/release, or lib/ of a release tarball);
#             it is linked with an rpath to it
#   --out     where to put the package (default bindings/tensorflow/build)
# Then: PYTHONPATH=OUT hccnrun -n 2 PY train.py   (train.py does `import hccn_tf`)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../layout.sh
. "$here/../layout.sh" # root (with include/) and the default lib, in the source tree or a tarball

py=/opt/hccn/venvs/tf/bin/python
out=$here/build
while [ $# -gt 0 ]; do
  case $1 in
    --python) py=$2; shift 2 ;;
    --lib) lib=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -f "$lib/libhccn.so" ] || { echo "build.sh: no libhccn.so in $lib (cargo build --release, or --lib DIR)" >&2; exit 1; }
lib=$(cd "$lib" && pwd)

# One line each: the compile flags, then the link flags.
flags=$(TF_CPP_MIN_LOG_LEVEL=3 "$py" -c '
import tensorflow as tf
print(" ".join(tf.sysconfig.get_compile_flags()))
print(" ".join(tf.sysconfig.get_link_flags()))' 2>/dev/null)
cflags=$(sed -n 1p <<<"$flags")
lflags=$(sed -n 2p <<<"$flags")
[ -n "$cflags" ] && [ -n "$lflags" ] || { echo "build.sh: $py cannot import tensorflow" >&2; exit 1; }
tfdir=$(sed -n 's/.*-L\([^ ]*\).*/\1/p' <<<"$lflags")

mkdir -p "$out/hccn_tf"
# shellcheck disable=SC2086 # the flags are word lists
g++ -O2 -shared -fPIC -Wall -Wno-sign-compare -Wno-deprecated-declarations -Wno-interference-size $cflags -I"$root/include" \
  "$here/hccn_tf_ops.cc" -o "$out/hccn_tf/_hccn_tf_ops.so.tmp" \
  -L"$lib" -lhccn -Wl,-rpath,"$lib" $lflags -Wl,-rpath,"$tfdir"
mv "$out/hccn_tf/_hccn_tf_ops.so.tmp" "$out/hccn_tf/_hccn_tf_ops.so"
# The Python package as it is (hccn_tf and hccn_tf.keras), without byte-code caches.
(cd "$here" && find hccn_tf -name '*.py') | while read -r f; do install -D -m 0644 "$here/$f" "$out/$f"; done
echo "build.sh: $out/hccn_tf ready (PYTHONPATH=$out)"
