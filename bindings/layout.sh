# Sourced by bindings/<name>/build.sh with `here` set to its directory: sets `root`, the
# directory that holds include/, and `lib`, where libhccn.so is unless --lib says otherwise. A
# binding sits in the source tree (bindings/<name>: the build in target/release) or in a release
# tarball or install prefix (share/hccn/bindings/<name>: the library in lib/).
if [ -f "$here/../../Cargo.toml" ]; then
  root=$(cd "$here/../.." && pwd)
  lib=$root/target/release
else
  root=$(cd "$here/../../../.." && pwd)
  lib=$root/lib
fi
