#!/usr/bin/env bash
# Builds hccn_ms against the installed MindSpore and lays out the importable package:
#   OUT/hccn_ms/__init__.py  OUT/hccn_ms/libhccn_ms.so
#
# libhccn_ms.so is MindSpore's collective library on CPU (soname libmpi_collective.so, entry
# point communication_lib_instance; see src/hccn_ms_lib.h) and holds the AOT kernels of the
# hccn_ms cells. It is compiled against the MindSpore wheel's own headers, with that wheel's
# std::string ABI, and records the wheel's version and commit: at load time it refuses any other
# MindSpore (src/hccn_ms_version.cc). Rebuild after upgrading MindSpore.
#
# Usage: bindings/mindspore/build.sh [--lib LIBDIR] [--out OUT] [--python PY] [--interface-test]
#                                    [--built-for VERSION]
#   --lib             where libhccn.so is (default target/release, or lib/ of a release
#                     tarball); linked with an rpath to it
#   --out             where to put the package (default bindings/mindspore/build)
#   --python          the interpreter whose MindSpore to build for
#                     (default /opt/hccn/venvs/mindspore/bin/python)
#   --interface-test  also build OUT/hccn_ms_interface_test.so (tests/interface.cc)
#   --built-for V     record MindSpore V instead of the installed version: a library the version
#                     guard must refuse (for its test)
# Then: PYTHONPATH=OUT hccnrun -n 2 -- PY train.py   (train.py imports hccn_ms first)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../layout.sh
. "$here/../layout.sh" # root (with include/) and the default lib, in the source tree or a tarball

out=$here/build
python=/opt/hccn/venvs/mindspore/bin/python
interface_test=0
pretend_version=
while [ $# -gt 0 ]; do
  case $1 in
    --lib) lib=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --interface-test) interface_test=1; shift ;;
    --built-for) pretend_version=$2; shift 2 ;;
    *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -f "$lib/libhccn.so" ] || { echo "build.sh: no libhccn.so in $lib (cargo build --release, or --lib DIR)" >&2; exit 1; }
lib=$(cd "$lib" && pwd)

# The package directory without importing MindSpore (its import takes seconds).
ms=$("$python" -c 'import importlib.util as u; s = u.find_spec("mindspore"); print(s.submodule_search_locations[0] if s else "")') ||
  { echo "build.sh: cannot run $python" >&2; exit 1; }
[ -n "$ms" ] && [ -f "$ms/version.py" ] || { echo "build.sh: no MindSpore installed for $python" >&2; exit 1; }
version=$(sed -n "s/^__version__ = '\(.*\)'$/\1/p" "$ms/version.py")
commit=$(sed -n "s/^__commit_id__ = '\[sha1\]:\([0-9a-f]*\),.*/\1/p" "$ms/.commit_id" 2>/dev/null || true)
abstract=$ms/lib/libmindspore_hardware_abstract.so
headers=$ms/include/mindspore
[ -n "$version" ] && [ -n "$commit" ] && [ -f "$abstract" ] && [ -d "$headers/ccsrc/include/runtime/hardware_abstract/collective" ] || {
  echo "build.sh: $ms lacks what hccn_ms builds against (version.py, .commit_id, lib/libmindspore_hardware_abstract.so, include/)" >&2
  exit 1
}

# The wheel's std::string ABI, read off a symbol it exports: `Ss` is the pre-C++11 string.
symbols=$(nm -D --defined-only "$abstract")
if grep -q ' _ZN9mindspore6device26CollectiveCommunicationLib9GetRankIdERKSs$' <<<"$symbols"; then
  cxx11_abi=0
elif grep -q ' _ZN9mindspore6device26CollectiveCommunicationLib9GetRankIdERKNSt7__cxx11' <<<"$symbols"; then
  cxx11_abi=1
else
  echo "build.sh: $abstract does not export CollectiveCommunicationLib::GetRankId; not a MindSpore hccn_ms knows" >&2
  exit 1
fi

# The wheel's headers are -isystem: their own warnings are not ours to fix.
cxxflags=(-std=c++17 -O2 -Wall -Wextra -Werror -D_GLIBCXX_USE_CXX11_ABI=$cxx11_abi -I"$root/include"
  -isystem "$headers/ccsrc" -isystem "$headers/core/include" -isystem "$headers/core")
# The base classes' out-of-line members come from the wheel's own library.
mindspore_link=("$abstract" -Wl,-rpath,"$ms/lib" -Wl,-rpath-link,"$ms/lib")

mkdir -p "$out/hccn_ms"
g++ "${cxxflags[@]}" -shared -fPIC -fvisibility=hidden \
  -DHCCN_MS_MINDSPORE_VERSION="\"${pretend_version:-$version}\"" -DHCCN_MS_MINDSPORE_COMMIT="\"$commit\"" \
  "$here"/src/*.cc -o "$out/hccn_ms/libhccn_ms.so.tmp" \
  -Wl,-soname,libmpi_collective.so -Wl,--no-undefined \
  -L"$lib" -lhccn -Wl,-rpath,"$lib" "${mindspore_link[@]}"
mv "$out/hccn_ms/libhccn_ms.so.tmp" "$out/hccn_ms/libhccn_ms.so"
if [ "$interface_test" = 1 ]; then
  g++ "${cxxflags[@]}" -shared -fPIC "$here/tests/interface.cc" -o "$out/hccn_ms_interface_test.so" \
    "${mindspore_link[@]}" -ldl
fi
cp "$here/hccn_ms/__init__.py" "$out/hccn_ms/__init__.py"
echo "build.sh: $out/hccn_ms ready for MindSpore ${pretend_version:-$version} ($commit, C++11 ABI $cxx11_abi) (PYTHONPATH=$out)"
