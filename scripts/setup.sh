#!/usr/bin/env bash
# Installs what hccn's build and tests need on a Debian machine, once: later runs find
# everything present and return in a second. Run as root (CI and the dev machines are).
set -euo pipefail

need_apt=()
command -v gcc >/dev/null 2>&1 || need_apt+=(gcc libc6-dev)
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
command -v make >/dev/null 2>&1 || need_apt+=(make)
# examples/cpp is built through find_package(hccn) from an installed prefix in the tests.
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
# The network-fault tests cut links between namespace hosts with nftables drops.
command -v nft >/dev/null 2>&1 || need_apt+=(nftables)
command -v ps >/dev/null 2>&1 || need_apt+=(procps)
command -v cargo >/dev/null 2>&1 || need_apt+=(cargo rustc)
# etcd-client's build generates its gRPC code with protoc; the tests run a real etcd.
command -v protoc >/dev/null 2>&1 || need_apt+=(protobuf-compiler)
# protoc's well-known types (google/protobuf/*.proto) come in a package of their own.
[ -f /usr/include/google/protobuf/descriptor.proto ] || need_apt+=(libprotobuf-dev)
command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server)
# The etcd TLS tests make their certificates with openssl.
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
# The launcher tests (tests/tests/launchers.rs) run a one-node Slurm of their own, Open MPI's
# mpirun (and its PMIx, whose header checks hccn's declarations), MPICH's mpiexec.
command -v slurmctld >/dev/null 2>&1 || need_apt+=(slurmctld)
command -v slurmd >/dev/null 2>&1 || need_apt+=(slurmd)
command -v srun >/dev/null 2>&1 || need_apt+=(slurm-client)
command -v munged >/dev/null 2>&1 || need_apt+=(munge)
command -v mpirun.openmpi >/dev/null 2>&1 || need_apt+=(openmpi-bin)
command -v mpicc.openmpi >/dev/null 2>&1 || need_apt+=(libopenmpi-dev)
pkg-config --exists pmix 2>/dev/null || need_apt+=(libpmix-dev)
command -v mpiexec.mpich >/dev/null 2>&1 || need_apt+=(mpich)

if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

# The sanitizer runtimes come with gcc; check that a sanitized program links.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo 'int main(void){return 0;}' > "$tmp/t.c"
if ! gcc -fsanitize=address,undefined "$tmp/t.c" -o "$tmp/t" 2>/dev/null; then
  echo "setup: installing the gcc sanitizer runtimes"
  apt-get update -qq && apt-get install -y -qq --no-install-recommends libasan8 libubsan1
fi

for tool in rustfmt cargo-clippy; do
  command -v "$tool" >/dev/null 2>&1 || { echo "setup: $tool is missing from the Rust toolchain" >&2; exit 1; }
done
echo "setup: ready ($(cargo --version))"
