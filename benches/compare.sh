#!/usr/bin/env bash
# Side-by-side benchmarks against Open MPI (and Gloo), in one run. Two steps:
#
# 1. Allreduce: hccn (hccn-perf), Open MPI (shared memory and TCP, our own MPI_Allreduce
#    program) and Gloo (torch.distributed, our own program), fp32 sum, 4 B .. 256 MiB, 2 and 4
#    ranks, hccn both on its default transports and with HCCN_TRANSPORT=tcp (compared with the
#    TCP peers), with memcpy, loopback iperf3 (one stream, and both directions at once as an
#    allreduce uses it), the cross-process read rate and the post-and-wait round of n processes
#    (hccn-limits) as the limits, and a 4-byte allreduce of 4 ranks bound to cores (hccnrun and
#    mpirun --bind-to core); prints one table per rank count with hccn/peer ratios. 3 to 5 min.
# 2. Every collective (allreduce, allgather, reduce_scatter, broadcast, alltoall, reduce,
#    gather, scatter):
#    one timing loop, benches/compare/colls.c, compiled for hccn's C ABI and for MPI, 64 B ..
#    64 MiB by 4x, 2 and 4 ranks over shared memory (Open MPI btl self,vader) and 2 ranks over
#    TCP (HCCN_TRANSPORT=tcp, btl self,tcp), the whole sweep twice; prints hccn/Open MPI
#    latency ratios and the latencies, and writes them between the compare:colls markers of
#    docs/algorithms.md (method and conventions there and in colls.c). About 6 min.
#
# Installs what is missing (Debian openmpi-bin, libopenmpi-dev, iperf3; torch comes from
# /opt/hccn/venvs/torch, made by scripts/setup-python.sh torch). Nothing here is a test.
# Usage: bash benches/compare.sh [--quick] [--colls-only]
#   --quick       a smoke run: allreduce up to 16 MiB; the every-collective sweep up to 1 MiB,
#                 once, and docs/algorithms.md is left alone
#   --colls-only  step 2 only
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
command="bash benches/compare.sh${*:+ $*}"
quick=0
colls_only=0
for arg in "$@"; do
    case "$arg" in
        --quick) quick=1 ;;
        --colls-only) colls_only=1 ;;
        *)
            echo "usage: bash benches/compare.sh [--quick] [--colls-only]" >&2
            exit 2
            ;;
    esac
done
max=$((256 << 20))
if ((quick)); then max=$((16 << 20)); fi

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
if ((!colls_only)) && ! "$py" -c 'import torch' >/dev/null 2>&1 && [[ -f scripts/setup-python.sh ]]; then
    log "making the torch virtualenv (scripts/setup-python.sh torch)"
    bash scripts/setup-python.sh torch >&2 || true
fi
have_torch=1
((colls_only)) || "$py" -c 'import torch' >/dev/null 2>&1 || { have_torch=0; log "no torch in /opt/hccn/venvs/torch: Gloo is left out"; }

# --- build -----------------------------------------------------------------------------------
log "building libhccn.so, hccn-perf, hccnrun, hccn-kernel-bench, hccn-limits and the C programs"
cargo build --release -q -p hccn-capi -p hccn-tools -p hccn-benches
bin=$root/target/release
mpicc -O2 -o "$out/allreduce_mpi" benches/compare/allreduce_mpi.c
mpicc -O2 -Wall -Wextra -DUSE_MPI -o "$out/colls_mpi" benches/compare/colls.c
cc -O2 -Wall -Wextra -Iinclude -o "$out/colls_hccn" benches/compare/colls.c \
    -L"$bin" -lhccn -Wl,-rpath,"$bin"

# --- step 1: allreduce beside Open MPI and Gloo ----------------------------------------------
allreduce_step() {
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
    for n in 2 4; do
        log "hccn, $n ranks"
        {
            # Fixed iteration counts per size band (hccn-perf times a fixed count); small sizes as
            # many as allreduce_mpi's 10,000, after a warm-up in which ranks settle on the cores.
            # Like allreduce_mpi, every size reports the median of 3 timed runs (--reps 3), each timed
            # by its slowest rank. Out of place only: the table compares those times.
            "$bin/hccnrun" -n "$n" "$bin/hccn-perf" --place out -b 4 -e 64K -f 4 -w 1000 -n 10000 --reps 3
            "$bin/hccnrun" -n "$n" "$bin/hccn-perf" --place out -b 256K -e 4M -f 4 -w 3 -n 20 --reps 3
            if ((max >= 16 << 20)); then
                "$bin/hccnrun" -n "$n" "$bin/hccn-perf" --place out -b 16M -e "$max" -f 4 -w 1 -n 3 --reps 3
            fi
        } >"$out/hccn-np$n.txt" 2>"$out/hccn-np$n.err" || log "hccn with $n ranks failed: $(tail -3 "$out/hccn-np$n.err")"
        log "hccn with buffers from hccn_mem_alloc (-R), $n ranks"
        {
            # Only transfers of 64 KiB and more are read in place, where -R matters.
            "$bin/hccnrun" -n "$n" "$bin/hccn-perf" --place out -R -b 256K -e 4M -f 4 -w 3 -n 20 --reps 3
            if ((max >= 16 << 20)); then
                "$bin/hccnrun" -n "$n" "$bin/hccn-perf" --place out -R -b 16M -e "$max" -f 4 -w 1 -n 3 --reps 3
            fi
        } >"$out/hccn-reg-np$n.txt" 2>"$out/hccn-reg-np$n.err" || log "hccn -R with $n ranks failed: $(tail -3 "$out/hccn-reg-np$n.err")"
        log "hccn over TCP only (HCCN_TRANSPORT=tcp), $n ranks"
        {
            HCCN_TRANSPORT=tcp "$bin/hccnrun" -n "$n" "$bin/hccn-perf" --place out -b 4 -e 64K -f 4 -w 1000 -n 3000 --reps 3
            HCCN_TRANSPORT=tcp "$bin/hccnrun" -n "$n" "$bin/hccn-perf" --place out -b 256K -e 4M -f 4 -w 3 -n 10 --reps 3
            if ((max >= 16 << 20)); then
                HCCN_TRANSPORT=tcp "$bin/hccnrun" -n "$n" "$bin/hccn-perf" --place out -b 16M -e "$max" -f 4 -w 1 -n 3 --reps 3
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
        t=$("$bin/hccnrun" -n 4 --bind-to core "$bin/hccn-perf" --place out -b 4 -e 4 -w 2000 -n 20000 --reps 3 2>/dev/null \
            | awk '$1 == "[0]" && $2 == "4" {print $7}')
        echo "hccn ${t:-failed}"
        t=$(mpirun --allow-run-as-root --oversubscribe --bind-to core:overload-allowed --mca pml ob1 -np 4 --mca btl self,vader "$out/allreduce_mpi" 4 4 4 2>/dev/null \
            | awk '$1 == "4" {print $2}')
        echo "mpi ${t:-failed}"
    } >"$out/bound.txt"

    python3 benches/compare/table.py "$out"
}

# --- step 2: every collective beside Open MPI --------------------------------------------------
colls_ops=(allreduce allgather reduce_scatter broadcast alltoall reduce gather scatter)
# One run of colls.c for library $1 (hccn or mpi) over transport $2 (shm or tcp) with $3 ranks and
# collective $5, appended to colls-$1-$2-np$3-sweep$4.txt; a run that fails is logged and its
# cells show as missing.
colls_run() {
    local lib=$1 transport=$2 n=$3 sweep=$4 op=$5
    local name="$out/colls-$lib-$transport-np$n-sweep$sweep"
    local args=(--max "$colls_max" --ops "$op")
    local cmd
    if [[ $lib == hccn ]]; then
        local bind=()
        if ((n <= $(nproc))); then bind=(--bind-to core); fi
        cmd=("$bin/hccnrun" --timeout 600 -n "$n" "${bind[@]}" "$out/colls_hccn" "${args[@]}")
        if [[ $transport == tcp ]]; then cmd=(env HCCN_TRANSPORT=tcp "${cmd[@]}"); fi
    else
        local btl=(--mca btl self,vader)
        if [[ $transport == tcp ]]; then btl=(--mca btl self,tcp --mca btl_tcp_if_include lo); fi
        cmd=(timeout -k 10 600 "${mpirun_colls[@]}" -np "$n" "${btl[@]}" "$out/colls_mpi" "${args[@]}")
    fi
    "${cmd[@]}" >>"$name.txt" 2>>"$name.err" || log "colls: $lib $transport np$n $op (sweep $sweep) failed: $(tail -3 "$name.err")"
    local wrong
    wrong=$(sed -E 's/^\[[0-9]+\] //' "$name.txt" | awk -v op="$op" '$1 == op && $NF == "WRONG" {printf " %s", $2}')
    if [[ -n $wrong ]]; then log "colls: $lib $transport np$n $op: WRONG results at bytes$wrong"; fi
}

colls_step() {
    local sweeps=2
    colls_max=$((64 << 20))
    if ((quick)); then sweeps=1 colls_max=$((1 << 20)); fi
    cut -d' ' -f1-3 /proc/loadavg >"$out/load.txt"
    local t0=$SECONDS sweep config lib i
    # Each collective is a run of its own, hccn's and Open MPI's back to back, the one first
    # that went second the time before: a change in the machine's load (it is shared) falls on
    # both alike, seconds apart rather than minutes.
    for ((sweep = 1; sweep <= sweeps; sweep++)); do
        for config in "shm 2" "shm 4" "tcp 2"; do
            log "colls sweep $sweep of $sweeps: $config ranks"
            for ((i = 0; i < ${#colls_ops[@]}; i++)); do
                local order=(hccn mpi)
                if (((sweep + i) % 2 == 0)); then order=(mpi hccn); fi
                for lib in "${order[@]}"; do
                    # shellcheck disable=SC2086
                    colls_run "$lib" $config "$sweep" "${colls_ops[i]}"
                done
            done
        done
    done
    cut -d' ' -f1-3 /proc/loadavg >>"$out/load.txt"
    log "every-collective sweep: $((SECONDS - t0)) s"
    local doc=(--doc docs/algorithms.md)
    if ((quick)); then doc=(); fi
    python3 benches/compare/colls_table.py "$out" "${doc[@]}" --command "$command"
}

# Step 1 binds neither library's ranks to cores (hccnrun's default). Step 2 places both as
# mpirun does by default: a core each while there are enough cores (2 ranks here), unbound when
# oversubscribed (4). Unbound on this shared machine, two ranks the scheduler put on one core
# while other work held the other measured that placement instead of the library: Open MPI's
# busy-polling ranks took 4 ms time slices in turn (4,000 us for a 64-byte allreduce), hccn's
# waiters spun out their 20 us before sleeping (34-55 us for 64 bytes instead of 0.5-1).
# ob1 so that the btl is used (Debian's Open MPI would pick UCX otherwise).
mpirun_=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca pml ob1)
mpirun_colls=(mpirun --allow-run-as-root --oversubscribe --mca pml ob1)
started=$SECONDS
if ((!colls_only)); then allreduce_step; fi
colls_step
log "raw outputs in $out; $((SECONDS - started)) s in all"
