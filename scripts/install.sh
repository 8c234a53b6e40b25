#!/usr/bin/env bash
# Installs hccn for C and C++ users under a prefix. See usage() below, or run with --help.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: install.sh --prefix DIR [--from BUILD_DIR] [--debug-symbols]

Installs hccn's C/C++ SDK under DIR:
  DIR/lib/libhccn.so.1                  the shared library (soname libhccn.so.1, C ABI v1),
  DIR/lib/libhccn.so -> libhccn.so.1    stripped of debug information
  DIR/lib/libhccn.a                     the static library
  DIR/include/hccn.h, hccn.hpp          C header, C++17 header
  DIR/bin/hccnrun, hccn-perf, hccn-trace, hccn-info
  DIR/lib/pkgconfig/hccn.pc             pkg-config --cflags --libs hccn         (shared)
  DIR/lib/pkgconfig/hccn-static.pc      pkg-config --cflags --libs hccn-static  (libhccn.a)
  DIR/lib/cmake/hccn/hccnConfig*.cmake  find_package(hccn) -> hccn::hccn, hccn::hccn_static

Where the files come from:
  - run from an unpacked release tarball (scripts/release.sh makes one): the tarball's own
    files; no Rust toolchain is needed;
  - run from the source tree: BUILD_DIR (default target/release), stripped while installed
    (objcopy). When BUILD_DIR has no build, it is built with cargo if cargo is on PATH.

Options:
  --prefix DIR      where to install (created if missing; required)
  --from BUILD_DIR  source tree only: the directory holding libhccn.so, libhccn.a and the tools
  --debug-symbols   also install the library's debug information, DIR/lib/.debug/
                    libhccn.so.1.debug (gdb and perf find it through the library's debuglink)
  -h, --help        this text
EOF
}

here=$(cd "$(dirname "$0")" && pwd -P)
prefix=
from=
debug_symbols=0
while [ $# -gt 0 ]; do
  case $1 in
    --prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
    --prefix=*) prefix=${1#--prefix=}; shift ;;
    --from) from=${2:?--from needs a directory}; shift 2 ;;
    --from=*) from=${1#--from=}; shift ;;
    --debug-symbols) debug_symbols=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "install.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
[ -n "$prefix" ] || { echo "install.sh: --prefix DIR is required (install.sh --help)" >&2; exit 2; }

ABI=1
SONAME=libhccn.so.$ABI
TOOLS="hccnrun hccn-perf hccn-trace hccn-info"
# What libhccn.a needs from the system: `rustc --print native-static-libs` for Linux/glibc
# (Rust's std; hccn itself adds nothing). A static link that lacks one fails, so the test that
# links examples/c with hccn-static.pc checks this list.
NATIVE_STATIC_LIBS="-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"

if [ -f "$here/lib/$SONAME" ] && [ -f "$here/include/hccn.h" ]; then
  mode=tarball
  [ -z "$from" ] || { echo "install.sh: --from is for the source tree; this is a release tarball" >&2; exit 2; }
  version=$(cat "$here/VERSION")
  templates=$here/share/hccn/packaging
  include_dir=$here/include
else
  mode=source
  root=$(cd "$here/.." && pwd)
  [ -f "$root/Cargo.toml" ] || { echo "install.sh: neither a release tarball nor hccn's source tree: $root" >&2; exit 1; }
  # The version is the workspace's ([workspace.package] version in Cargo.toml).
  version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' "$root/Cargo.toml" | head -n1)
  [ -n "$version" ] || { echo "install.sh: no version in $root/Cargo.toml" >&2; exit 1; }
  templates=$root/packaging
  include_dir=$root/include
  built() { [ -f "$1/libhccn.so" ] && [ -f "$1/libhccn.a" ] && [ -x "$1/hccnrun" ]; }
  if [ -z "$from" ]; then
    from=$root/target/release
    if ! built "$from"; then
      if command -v cargo >/dev/null 2>&1; then
        echo "install.sh: no release build in $from; building it (cargo build --release)"
        (cd "$root" && cargo build --release -p hccn-capi -p hccn-tools)
      else
        cat >&2 <<EOF
install.sh: there is no build of hccn in $from, and no cargo on PATH to make one.
  Either install from a release tarball, which needs no Rust toolchain: unpack
  hccn-$version-linux-<arch>.tar.gz and run its install.sh --prefix DIR
  (scripts/release.sh makes the tarball on a machine with Rust);
  or install Rust (https://rustup.rs) and run: cargo build --release -p hccn-capi -p hccn-tools;
  or point --from at a directory that holds libhccn.so, libhccn.a and hccnrun.
EOF
        exit 1
      fi
    fi
  fi
  from=$(cd "$from" && pwd)
  built "$from" || { echo "install.sh: $from lacks libhccn.so, libhccn.a or hccnrun (cargo build --release -p hccn-capi -p hccn-tools)" >&2; exit 1; }
  for tool in objcopy strip; do
    command -v $tool >/dev/null 2>&1 || { echo "install.sh: $tool (binutils) is needed to strip the build" >&2; exit 1; }
  done
fi

mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
install -d "$prefix/lib/pkgconfig" "$prefix/lib/cmake/hccn" "$prefix/include" "$prefix/bin"
# Replace, never write through, what an earlier install left (a link could point anywhere).
rm -f "$prefix/lib/libhccn.so" "$prefix/lib/$SONAME"

if [ $mode = tarball ]; then
  install -m 0755 "$here/lib/$SONAME" "$prefix/lib/$SONAME"
  install -m 0644 "$here/lib/libhccn.a" "$prefix/lib/libhccn.a"
  for tool in $TOOLS; do install -m 0755 "$here/bin/$tool" "$prefix/bin/$tool"; done
  if [ $debug_symbols = 1 ]; then
    install -d "$prefix/lib/.debug"
    install -m 0644 "$here/debug/$SONAME.debug" "$prefix/lib/.debug/$SONAME.debug"
  fi
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  # The debug information goes to its own file; the library keeps a debuglink to it (so the
  # file can be added later) and loses its symbol table (the dynamic one stays).
  cp "$from/libhccn.so" "$work/$SONAME"
  objcopy --only-keep-debug --compress-debug-sections=zlib "$work/$SONAME" "$work/$SONAME.debug"
  strip --strip-unneeded "$work/$SONAME"
  (cd "$work" && objcopy --add-gnu-debuglink="$SONAME.debug" "$SONAME")
  install -m 0755 "$work/$SONAME" "$prefix/lib/$SONAME"
  if [ $debug_symbols = 1 ]; then
    install -d "$prefix/lib/.debug"
    install -m 0644 "$work/$SONAME.debug" "$prefix/lib/.debug/$SONAME.debug"
  fi
  # The archive keeps its symbols (a linker needs them), not its debug information.
  cp "$from/libhccn.a" "$work/libhccn.a"
  strip --strip-debug "$work/libhccn.a"
  install -m 0644 "$work/libhccn.a" "$prefix/lib/libhccn.a"
  for tool in $TOOLS; do
    [ -x "$from/$tool" ] || continue
    cp "$from/$tool" "$work/$tool"
    strip "$work/$tool"
    install -m 0755 "$work/$tool" "$prefix/bin/$tool"
  done
fi
ln -s "$SONAME" "$prefix/lib/libhccn.so"
install -m 0644 "$include_dir/hccn.h" "$include_dir/hccn.hpp" "$prefix/include/"

native_static_libs_cmake=$(echo "$NATIVE_STATIC_LIBS" | sed 's/-l//g; s/ /;/g')
fill() {
  sed -e "s|@PREFIX@|$prefix|g" -e "s|@VERSION@|$version|g" -e "s|@SONAME@|$SONAME|g" \
    -e "s|@NATIVE_STATIC_LIBS@|$NATIVE_STATIC_LIBS|g" \
    -e "s|@NATIVE_STATIC_LIBS_CMAKE@|$native_static_libs_cmake|g" "$templates/$1" > "$2"
}
fill hccn.pc.in "$prefix/lib/pkgconfig/hccn.pc"
fill hccn-static.pc.in "$prefix/lib/pkgconfig/hccn-static.pc"
fill hccnConfig.cmake.in "$prefix/lib/cmake/hccn/hccnConfig.cmake"
fill hccnConfigVersion.cmake.in "$prefix/lib/cmake/hccn/hccnConfigVersion.cmake"

echo "install.sh: hccn $version installed under $prefix"
echo "  run:        $prefix/bin/hccnrun -n 2 ./app"
echo "  pkg-config: PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs hccn   (or hccn-static)"
echo "  CMake:      cmake -DCMAKE_PREFIX_PATH=$prefix ...   then find_package(hccn), hccn::hccn or hccn::hccn_static"
