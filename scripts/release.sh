#!/usr/bin/env bash
# Makes hccn's release artifacts from a release build. See usage() below, or run with --help.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

usage() {
  cat <<'EOF'
usage: scripts/release.sh [--out DIR] [--from BUILD_DIR] [--wheel]

Makes, in DIR (default target/dist):
  hccn-VERSION-linux-ARCH.tar.gz         the C/C++ SDK for users without a Rust toolchain:
                                         README.md (packaging/release-README.md), bin/ (hccnrun,
                                         hccn-perf, hccn-trace, hccn-info), lib/ (libhccn.so.1,
                                         libhccn.so, libhccn.a, pkg-config, CMake), include/,
                                         debug/libhccn.so.1.debug, docs and examples under
                                         share/doc/hccn, the TensorFlow and MindSpore bindings'
                                         sources under share/hccn/bindings, install.sh, SHA256SUMS
  hccn-VERSION-linux-ARCH.tar.gz.sha256  the tarball's checksum (sha256sum -c)
  with --wheel: the Python package carrying the library and the tools (pip wheel
                bindings/python), and torch.distributed's "hccn" backend when the Python that
                builds it has torch: hccn-VERSION-cpXY-cpXY-manylinux_2_N_ARCH.whl (+ .sha256; N:
                the newest glibc the build needs), for that Python and that torch, which the
                wheel's `torch` extra pins and `import hccn.torch` checks; without torch
                hccn-VERSION-py3-none-manylinux_2_N_ARCH.whl, for any Python 3 (its build backend,
                setuptools, from PyPI). The Python: $PYTHON, else the pinned torch venv
                /opt/hccn/venvs/torch (scripts/setup-python.sh torch) when it exists, else python3.

BUILD_DIR (default target/release) must hold a release build; when the default is missing it
is built (cargo build --release -p hccn-capi -p hccn-tools).

Users unpack the tarball and run `./install.sh --prefix DIR` (no cargo needed), or use the
unpacked tree in place: its pkg-config files are relative to themselves.
EOF
}

out=$root/target/dist
from=
wheel=0
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --out=*) out=${1#--out=}; shift ;;
    --from) from=${2:?--from needs a directory}; shift 2 ;;
    --from=*) from=${1#--from=}; shift ;;
    --wheel) wheel=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "release.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)
arch=$(uname -m)
name=hccn-$version-linux-$arch
if [ -z "$from" ]; then
  from=$root/target/release
  if [ ! -f "$from/libhccn.so" ] || [ ! -f "$from/libhccn.a" ] || [ ! -x "$from/hccn-trace" ]; then
    cargo build --release -p hccn-capi -p hccn-tools
  fi
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
stage=$work/$name

# The same install a user makes, then moved aside what a prefix should not hold by default.
bash scripts/install.sh --prefix "$stage" --from "$from" --debug-symbols >/dev/null
install -d "$stage/debug"
mv "$stage/lib/.debug/libhccn.so.1.debug" "$stage/debug/"
rmdir "$stage/lib/.debug"
for tool in hccnrun hccn-perf hccn-trace hccn-info; do
  [ -x "$stage/bin/$tool" ] || { echo "release.sh: $from/$tool is missing (cargo build --release -p hccn-tools)" >&2; exit 1; }
done
# Usable in place: pkg-config files relative to their own directory (the CMake config is).
sed -i 's|^prefix=.*|prefix=${pcfiledir}/../..|' "$stage/lib/pkgconfig/hccn.pc" "$stage/lib/pkgconfig/hccn-static.pc"

install -m 0755 scripts/install.sh "$stage/install.sh"
echo "$version" > "$stage/VERSION"
install -d "$stage/share/hccn/packaging" "$stage/share/doc/hccn/docs" "$stage/share/doc/hccn/examples"
install -m 0644 packaging/*.in "$stage/share/hccn/packaging/"
install -m 0644 README.md "$stage/share/doc/hccn/"
install -m 0644 docs/*.md "$stage/share/doc/hccn/docs/"
cp -r examples/c examples/cpp "$stage/share/doc/hccn/examples/"
# The tarball's own README (its paths are the tarball's), and the framework bindings' sources
# with their build.sh, which finds include/ and lib/ of the unpacked tree by itself.
install -m 0644 packaging/release-README.md "$stage/README.md"
find bindings/layout.sh bindings/late_rank.py bindings/tensorflow bindings/mindspore -type f ! -path '*/build/*' ! -path '*/__pycache__/*' \
  -exec install -D -m 0644 {} "$stage/share/hccn/"{} \;
chmod 0755 "$stage/share/hccn/bindings/tensorflow/build.sh" "$stage/share/hccn/bindings/mindspore/build.sh"

(cd "$stage" && find . -type f ! -name SHA256SUMS -printf '%P\n' | LC_ALL=C sort | xargs sha256sum > SHA256SUMS)
# Reproducible: the same build gives the same bytes (names sorted, owner and times fixed).
mtime=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
tar -C "$work" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$mtime" -cf - "$name" \
  | gzip -n > "$out/$name.tar.gz"
(cd "$out" && sha256sum "$name.tar.gz" > "$name.tar.gz.sha256")
echo "release.sh: $out/$name.tar.gz ($(du -h "$out/$name.tar.gz" | cut -f1))"

if [ $wheel = 1 ]; then
  torch_venv=/opt/hccn/venvs/torch/bin/python
  py=${PYTHON:-$( [ -x $torch_venv ] && echo $torch_venv || echo python3)}
  torch=$("$py" -c 'from importlib.metadata import version; print(version("torch"))' 2>/dev/null || true)
  pin=$(sed -n 's/^TORCH_PIN="torch==\(.*\)"/\1/p' scripts/setup-python.sh)
  isolation=()
  if [ -n "$torch" ]; then
    # The backend is compiled against the torch of $py (reused from target/torch-ext when up to
    # date): the build must see it, so it runs in $py's environment (which has setuptools).
    isolation=(--no-build-isolation)
    [ "${torch%%+*}" = "$pin" ] || echo "release.sh: note: $py has torch $torch, not the pinned $pin" >&2
  fi
  rm -f "$out"/hccn-"$version"-*.whl "$out"/hccn-"$version"-*.whl.sha256
  HCCN_BUILD_DIR=$from "$py" -m pip wheel -q --disable-pip-version-check --no-deps "${isolation[@]}" \
    --wheel-dir "$out" bindings/python
  rm -rf bindings/python/build bindings/python/hccn.egg-info
  whl=$(cd "$out" && ls hccn-"$version"-*.whl)
  (cd "$out" && sha256sum "$whl" > "$whl.sha256")
  backend="torch backend for torch ${torch%%+*}"
  [ -n "$torch" ] || backend="no torch backend: $py has no torch"
  echo "release.sh: $out/$whl ($(du -h "$out/$whl" | cut -f1); $backend)"
fi
