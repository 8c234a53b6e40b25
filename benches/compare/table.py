"""Merges the outputs of benches/compare.sh into one table per rank count.
Usage: python3 table.py DIR. Reads DIR/{hccn,hccn-reg,hccn-tcp,mpi-shm,mpi-tcp,gloo}-np{2,4}.txt ("bytes us"
lines, or hccn-perf tables; hccn-reg is hccn-perf -R, buffers from hccn_mem_alloc; hccn-tcp is
HCCN_TRANSPORT=tcp), DIR/memcpy.txt (hccn-kernel-bench output), DIR/iperf3.json and
DIR/iperf3-bidir.json, DIR/limits.txt (hccn-limits output) and DIR/bound.txt (4-byte latency of
4 ranks bound to cores: "hccn US" and "mpi US" lines)."""
import json
import os
import sys

PEERS = [("mpi-shm", "MPI shm"), ("mpi-tcp", "MPI tcp"), ("gloo", "Gloo")]
# (hccn run, peer): hccn on its default transports against the shared-memory MPI and Gloo (what
# a user would pick on one host), hccn over TCP only against the two TCP peers (Gloo has no
# other transport).
RATIOS = [("hccn", "mpi-shm"), ("hccn", "gloo"), ("hccn-tcp", "mpi-tcp"), ("hccn-tcp", "gloo")]
HCCN_NAMES = {"hccn": "hccn", "hccn-tcp": "hccn tcp"}


def read_times(path):
    """bytes -> microseconds, from "bytes us" lines or hccn-perf rows ("[0] size count ... time",
    the out-of-place time)."""
    out = {}
    if not os.path.exists(path):
        return out
    for line in open(path):
        f = line.split()
        if f and f[0] == "[0]":
            f = f[1:]
            if len(f) in (9, 13) and f[0].isdigit():
                out[int(f[0])] = float(f[5])
        elif len(f) == 2 and f[0].isdigit():
            out[int(f[0])] = float(f[1])
    return out


def busbw(nbytes, us, n):
    return nbytes / (us * 1e3) * 2 * (n - 1) / n


def cell(t, nbytes, n):
    if t is None:
        return "-"
    return f"{t:,.1f} / {busbw(nbytes, t, n):.2f}"


def label(b):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k} {unit}"
    return f"{b} B"


def iperf_gbs(path, keys):
    """GB/s received, summed over the `keys` of an iperf3 -J result's "end"; None if missing."""
    try:
        end = json.load(open(path))["end"]
        return sum(end[k]["bits_per_second"] for k in keys) / 8e9
    except (OSError, ValueError, KeyError):
        return None


def main():
    d = sys.argv[1]
    memcpy = {}
    if os.path.exists(os.path.join(d, "memcpy.txt")):
        for line in open(os.path.join(d, "memcpy.txt")):
            f = line.split()
            if len(f) >= 3 and f[0].isdigit() and f[1] == "memcpy":
                memcpy[int(f[0])] = float(f[2])
    iperf = iperf_gbs(os.path.join(d, "iperf3.json"), ["sum_received"])
    bidir = iperf_gbs(os.path.join(d, "iperf3-bidir.json"), ["sum_received", "sum_received_bidir_reverse"])
    print("AllReduce fp32 sum, in one run on this machine. Cells: latency us / busbw GB/s "
          "(busbw = bytes/time * 2(n-1)/n).")
    print("Ratios are peer time / hccn time (heap buffers, as the peers use): above 1 hccn is faster.")
    print("hccn -R: hccn-perf -R, buffers from hccn_mem_alloc, which same-host peers map and read in place.")
    print("hccn tcp: HCCN_TRANSPORT=tcp, every byte over loopback TCP, compared with the TCP peers.")
    names = dict(PEERS)
    for n in (2, 4):
        runs = {k: read_times(os.path.join(d, f"{k}-np{n}.txt")) for k in ("hccn", "hccn-reg", "hccn-tcp")}
        peers = {k: read_times(os.path.join(d, f"{k}-np{n}.txt")) for k, _ in PEERS}
        sizes = sorted({s for t in list(runs.values()) + list(peers.values()) for s in t})
        if not sizes:
            continue
        head = ["size", f"hccn np{n}", f"hccn -R np{n}", f"hccn tcp np{n}"] + [f"{name} np{n}" for _, name in PEERS]
        head += [f"{HCCN_NAMES[h]} vs {names[p]}" for h, p in RATIOS] + ["memcpy GB/s"]
        rows = []
        for s in sizes:
            row = [label(s)] + [cell(runs[k].get(s), s, n) for k in ("hccn", "hccn-reg", "hccn-tcp")]
            row += [cell(peers[k].get(s), s, n) for k, _ in PEERS]
            for h, p in RATIOS:
                ht, pt = runs[h].get(s), peers[p].get(s)
                row.append(f"{pt / ht:.2f}x" if ht and pt else "-")
            row.append(f"{memcpy[s]:.1f}" if s in memcpy else "")
            rows.append(row)
        widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
        print()
        print("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |")
        print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
        for r in rows:
            print("| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |")
    print()
    one = f"{iperf:.2f} GB/s" if iperf else "not measured"
    both = f"{bidir:.2f} GB/s" if bidir else "not measured"
    print("Limits: memcpy (1 thread, GB/s of bytes copied) in the last column where measured; "
          f"loopback TCP (iperf3, 3 s): 1 stream {one}, both directions at once (--bidir, the sum) {both}. "
          "In a ring allreduce each of n ranks sends busbw x time bytes, so together they move n x busbw "
          "through loopback: with 2 ranks busbw can reach at most half of the --bidir sum.")
    limits = os.path.join(d, "limits.txt")
    if os.path.exists(limits):
        print("Floors measured without any library (hccn-limits): with heap buffers each rank of a 2-rank "
              "allreduce reads busbw x time bytes out of its peer's private memory, so the cross-process "
              "read rate bounds the busbw of a single-copy path, and the heap allreduce line is that path "
              "written out without a library; the post-and-wait round is a 4-byte "
              "allreduce with the data, checks and API taken away.")
        for line in open(limits):
            if not line.startswith("#") and line.strip():
                print("  " + line.strip())
    bound = os.path.join(d, "bound.txt")
    if os.path.exists(bound):
        got = dict(line.split(None, 1) for line in open(bound) if line.strip())
        print("4-byte allreduce, 4 ranks each bound to a core (hccnrun --bind-to core, mpirun --bind-to core; "
              "the table's runs leave placement to the scheduler, which sometimes puts 3 of 4 on one core "
              "until hccn's ranks move themselves): "
              f"hccn {got.get('hccn', '-').strip()} us, Open MPI shm {got.get('mpi', '-').strip()} us")


if __name__ == "__main__":
    main()
