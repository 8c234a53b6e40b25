#!/usr/bin/env bash
# Installs hccn for C and C++ users under a prefix:
#   PREFIX/lib/libhccn.so, libhccn.a
#   PREFIX/include/hccn.h, hccn.hpp
#   PREFIX/lib/pkgconfig/hccn.pc                 pkg-config --cflags --libs hccn
#   PREFIX/lib/cmake/hccn/hccnConfig*.cmake      find_package(hccn) -> hccn::hccn, hccn::hccn_static
#   PREFIX/bin/hccnrun (and hccn-info, hccn-perf, hccn-trace when built)
#
# Usage: scripts/install.sh --prefix DIR [--from BUILD_DIR]
#   --from  where libhccn.so/.a and the tools are (default: target/release, built here with
#           `cargo build --release` when missing)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

prefix=
from=
while [ $# -gt 0 ]; do
  case $1 in
    --prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
    --prefix=*) prefix=${1#--prefix=}; shift ;;
    --from) from=${2:?--from needs a directory}; shift 2 ;;
    --from=*) from=${1#--from=}; shift ;;
    -h | --help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $1 (usage: scripts/install.sh --prefix DIR [--from BUILD_DIR])" >&2; exit 2 ;;
  esac
done
[ -n "$prefix" ] || { echo "install.sh: --prefix DIR is required" >&2; exit 2; }
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)

if [ -z "$from" ]; then
  from=$root/target/release
  if [ ! -f "$from/libhccn.so" ] || [ ! -f "$from/libhccn.a" ] || [ ! -x "$from/hccnrun" ]; then
    echo "install.sh: building the release library and launcher"
    cargo build --release -p hccn-capi -p hccn-tools
  fi
fi
for f in libhccn.so libhccn.a; do
  [ -f "$from/$f" ] || { echo "install.sh: $from/$f is missing (cargo build --release)" >&2; exit 1; }
done

# The version is the workspace's ([workspace.package] version in Cargo.toml).
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)
[ -n "$version" ] || { echo "install.sh: no version in Cargo.toml" >&2; exit 1; }
# What libhccn.a needs from the system (rustc --print native-static-libs on Linux/glibc).
native_static_libs="-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"
native_static_libs_cmake=$(echo "$native_static_libs" | sed 's/-l//g; s/ /;/g')

install -d "$prefix/lib/pkgconfig" "$prefix/lib/cmake/hccn" "$prefix/include" "$prefix/bin"
install -m 0755 "$from/libhccn.so" "$prefix/lib/libhccn.so"
install -m 0644 "$from/libhccn.a" "$prefix/lib/libhccn.a"
install -m 0644 include/hccn.h include/hccn.hpp "$prefix/include/"
for tool in hccnrun hccn-info hccn-perf hccn-trace; do
  if [ -x "$from/$tool" ]; then install -m 0755 "$from/$tool" "$prefix/bin/$tool"; fi
done

fill() {
  sed -e "s|@PREFIX@|$prefix|g" -e "s|@VERSION@|$version|g" \
    -e "s|@NATIVE_STATIC_LIBS@|$native_static_libs|g" \
    -e "s|@NATIVE_STATIC_LIBS_CMAKE@|$native_static_libs_cmake|g" "$1" > "$2"
}
fill packaging/hccn.pc.in "$prefix/lib/pkgconfig/hccn.pc"
fill packaging/hccnConfig.cmake.in "$prefix/lib/cmake/hccn/hccnConfig.cmake"
fill packaging/hccnConfigVersion.cmake.in "$prefix/lib/cmake/hccn/hccnConfigVersion.cmake"

echo "install.sh: hccn $version installed under $prefix"
echo "  pkg-config: PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs hccn"
echo "  CMake:      cmake -DCMAKE_PREFIX_PATH=$prefix ...   then find_package(hccn) and hccn::hccn"
