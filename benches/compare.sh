#!/usr/bin/env bash
# Side-by-side allreduce benchmark, in one run: hccn (hccn-perf), Open MPI (shared memory and
# TCP, our own MPI_Allreduce program) and Gloo (torch.distributed, our own program), fp32 sum,
# 4 B .. 256 MiB, 2 and 4 ranks, hccn both on its default transports and with
# HCCN_TRANSPORT=tcp (compared with the TCP peers), with memcpy, loopback iperf3 (one stream,
# and both directions at once as an allreduce uses it), the cross-process read rate and the
# post-and-wait round of n processes (hccn-limits) as the limits, and a 4-byte allreduce of 4
# ranks bound to cores (hccnrun and mpirun --bind-to core); prints one table per rank count with
# hccn/peer ratios. Installs what is missing (Debian openmpi-bin,
# libopenmpi-dev, iperf3; torch comes from /opt/hccn/venvs/torch, made by
# scripts/setup-python.sh torch). Takes 3 to 5 minutes on the 2-core machine; nothing here is a
# test. Usage: bash benches/compare.sh [--quick]   (--quick: up to 16 MiB, for a smoke run)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
max=$((256 << 20))
if [[ "${1:-}" == "--quick" ]]; then max=$((16 << 20)); fi

out=$(mktemp -d "${TMPDIR:-/tmp}/hccn-compare.XXXXXX")
iperf_pid=""
cleanup() {
    if [[ -n "$iperf_pid" ]]; then kill "$iperf_pid" 2>/dev/null || true; fi
}
trap cleanup EXIT
log() { echo "compare.sh: $*" >&2; }

# --- what is missing -----------------------------------------------------------------------
missing=()
for pkg in openmpi-bin libopenmpi-dev iperf3; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
py=/opt/hccn/venvs/torch/bin/python
if ! "$py" -c 'import torch' >/dev/null 2>&1 && [[ -f scripts/setup-python.sh ]]; then
    log "making the torch virtualenv (scripts/setup-python.sh torch)"
    bash scripts/setup-python.sh torch >&2 || true
fi
have_torch=1
"$py" -c 'import torch' >/dev/null 2>&1 || { have_torch=0; log "no torch in /opt/hccn/venvs/torch: Gloo is left out"; }

# --- build -----------------------------------------------------------------------------------
log "building hccn-perf, hccnrun, hccn-kernel-bench, hccn-limits and the MPI program"
cargo build --release -q -p hccn-tools -p hccn-benches
bin=$root/target/release
mpicc -O2 -o "$out/allreduce_mpi" benches/compare/allreduce_mpi.c

# --- limits ----------------------------------------------------------------------------------
log "memcpy and the fp32 sum kernel"
"$bin/hccn-kernel-bench" --only fp32_sum >"$out/memcpy.txt"
log "cross-process read and post-and-wait floors (hccn-limits)"
"$bin/hccn-limits" >"$out/limits.txt" || log "hccn-limits failed"
log "loopback iperf3"
port=$((20000 + RANDOM % 20000))
iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
iperf_pid=$!
sleep 0.5
iperf3 -c 127.0.0.1 -p "$port" -t 3 -J >"$out/iperf3.json" 2>/dev/null || log "iperf3 failed"
wait "$iperf_pid" 2>/dev/null || true
# Both directions at once: each rank of a TCP allreduce sends and receives as much.
iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
iperf_pid=$!
sleep 0.5
iperf3 -c 127.0.0.1 -p "$port" -t 3 --bidir -J >"$out/iperf3-bidir.json" 2>/dev/null || log "iperf3 --bidir failed"
wait "$iperf_pid" 2>/dev/null || true
iperf_pid=""

# --- the runs ----------------------------------------------------------------------------------
mpirun_=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca pml ob1)
for n in 2 4; do
    log "hccn, $n ranks"
    {
        # Fixed iteration counts per size band (hccn-perf times a fixed count); small sizes as
        # many as allreduce_mpi's 10,000, after a warm-up in which ranks settle on the cores.
        # Like allreduce_mpi, every size reports the median of 3 timed runs (--reps 3), each timed
        # by its slowest rank.
        "$bin/hccnrun" -n "$n" "$bin/hccn-perf" -b 4 -e 64K -f 4 -w 1000 -n 10000 --reps 3
        "$bin/hccnrun" -n "$n" "$bin/hccn-perf" -b 256K -e 4M -f 4 -w 3 -n 20 --reps 3
        if ((max >= 16 << 20)); then
            "$bin/hccnrun" -n "$n" "$bin/hccn-perf" -b 16M -e "$max" -f 4 -w 1 -n 3 --reps 3
        fi
    } >"$out/hccn-np$n.txt" 2>"$out/hccn-np$n.err" || log "hccn with $n ranks failed: $(tail -3 "$out/hccn-np$n.err")"
    log "hccn with buffers from hccn_mem_alloc (-R), $n ranks"
    {
        # Only transfers of 64 KiB and more are read in place, where -R matters.
        "$bin/hccnrun" -n "$n" "$bin/hccn-perf" -R -b 256K -e 4M -f 4 -w 3 -n 20 --reps 3
        if ((max >= 16 << 20)); then
            "$bin/hccnrun" -n "$n" "$bin/hccn-perf" -R -b 16M -e "$max" -f 4 -w 1 -n 3 --reps 3
        fi
    } >"$out/hccn-reg-np$n.txt" 2>"$out/hccn-reg-np$n.err" || log "hccn -R with $n ranks failed: $(tail -3 "$out/hccn-reg-np$n.err")"
    log "hccn over TCP only (HCCN_TRANSPORT=tcp), $n ranks"
    {
        HCCN_TRANSPORT=tcp "$bin/hccnrun" -n "$n" "$bin/hccn-perf" -b 4 -e 64K -f 4 -w 1000 -n 3000 --reps 3
        HCCN_TRANSPORT=tcp "$bin/hccnrun" -n "$n" "$bin/hccn-perf" -b 256K -e 4M -f 4 -w 3 -n 10 --reps 3
        if ((max >= 16 << 20)); then
            HCCN_TRANSPORT=tcp "$bin/hccnrun" -n "$n" "$bin/hccn-perf" -b 16M -e "$max" -f 4 -w 1 -n 3 --reps 3
        fi
    } >"$out/hccn-tcp-np$n.txt" 2>"$out/hccn-tcp-np$n.err" || log "hccn tcp with $n ranks failed: $(tail -3 "$out/hccn-tcp-np$n.err")"
    log "Open MPI shared memory, $n ranks"
    "${mpirun_[@]}" -np "$n" --mca btl self,vader "$out/allreduce_mpi" 4 "$max" 4 \
        >"$out/mpi-shm-np$n.txt" 2>"$out/mpi-shm-np$n.err" || log "MPI shm failed: $(tail -3 "$out/mpi-shm-np$n.err")"
    log "Open MPI TCP, $n ranks"
    "${mpirun_[@]}" -np "$n" --mca btl self,tcp --mca btl_tcp_if_include lo "$out/allreduce_mpi" 4 "$max" 4 \
        >"$out/mpi-tcp-np$n.txt" 2>"$out/mpi-tcp-np$n.err" || log "MPI tcp failed: $(tail -3 "$out/mpi-tcp-np$n.err")"
    if ((have_torch)); then
        log "Gloo, $n ranks"
        timeout 300 "$py" benches/compare/allreduce_gloo.py "$n" 4 "$max" 4 \
            >"$out/gloo-np$n.txt" 2>"$out/gloo-np$n.err" || log "Gloo failed: $(tail -3 "$out/gloo-np$n.err")"
    fi
done

log "4-byte allreduce, 4 ranks bound to cores (hccnrun --bind-to core, mpirun --bind-to core)"
{
    t=$("$bin/hccnrun" -n 4 --bind-to core "$bin/hccn-perf" -b 4 -e 4 -w 2000 -n 20000 --reps 3 2>/dev/null \
        | awk '$1 == "[0]" && $2 == "4" {print $7}')
    echo "hccn ${t:-failed}"
    t=$(mpirun --allow-run-as-root --oversubscribe --bind-to core:overload-allowed --mca pml ob1 -np 4 --mca btl self,vader "$out/allreduce_mpi" 4 4 4 2>/dev/null \
        | awk '$1 == "4" {print $2}')
    echo "mpi ${t:-failed}"
} >"$out/bound.txt"

python3 benches/compare/table.py "$out"
log "raw outputs in $out"
