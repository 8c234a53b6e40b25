"""Merges the outputs of benches/compare.sh into one table per rank count.
Usage: python3 table.py DIR. Reads DIR/{hccn,hccn-reg,mpi-shm,mpi-tcp,gloo}-np{2,4}.txt ("bytes us"
lines, or hccn-perf tables; hccn-reg is hccn-perf -R, buffers from hccn_mem_alloc), DIR/memcpy.txt (hccn-kernel-bench output) and DIR/iperf3.json."""
import json
import os
import sys

PEERS = [("mpi-shm", "MPI shm"), ("mpi-tcp", "MPI tcp"), ("gloo", "Gloo")]


def read_times(path):
    """bytes -> microseconds, from "bytes us" lines or hccn-perf rows ("[0] size count ... time")."""
    out = {}
    if not os.path.exists(path):
        return out
    for line in open(path):
        f = line.split()
        if f and f[0] == "[0]":
            f = f[1:]
            if len(f) == 9 and f[0].isdigit():
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


def main():
    d = sys.argv[1]
    memcpy = {}
    if os.path.exists(os.path.join(d, "memcpy.txt")):
        for line in open(os.path.join(d, "memcpy.txt")):
            f = line.split()
            if len(f) >= 3 and f[0].isdigit() and f[1] == "memcpy":
                memcpy[int(f[0])] = float(f[2])
    iperf = None
    try:
        j = json.load(open(os.path.join(d, "iperf3.json")))
        iperf = j["end"]["sum_received"]["bits_per_second"] / 8e9
    except (OSError, ValueError, KeyError):
        pass
    print("AllReduce fp32 sum, in one run on this machine. Cells: latency us / busbw GB/s "
          "(busbw = bytes/time * 2(n-1)/n).")
    print("Ratios are peer time / hccn time (heap buffers, as the peers use): above 1 hccn is faster.")
    print("hccn -R: hccn-perf -R, buffers from hccn_mem_alloc, which same-host peers map and read in place.")
    for n in (2, 4):
        hccn = read_times(os.path.join(d, f"hccn-np{n}.txt"))
        reg = read_times(os.path.join(d, f"hccn-reg-np{n}.txt"))
        peers = {k: read_times(os.path.join(d, f"{k}-np{n}.txt")) for k, _ in PEERS}
        sizes = sorted(set(hccn) | {s for p in peers.values() for s in p})
        if not sizes:
            continue
        head = ["size", f"hccn np{n}", f"hccn -R np{n}"] + [f"{name} np{n}" for _, name in PEERS]
        head += [f"hccn vs {name}" for _, name in PEERS] + ["memcpy GB/s"]
        rows = []
        for s in sizes:
            h = hccn.get(s)
            row = [label(s), cell(h, s, n), cell(reg.get(s), s, n)]
            row += [cell(peers[k].get(s), s, n) for k, _ in PEERS]
            for k, _ in PEERS:
                p = peers[k].get(s)
                row.append(f"{p / h:.2f}x" if h and p else "-")
            row.append(f"{memcpy[s]:.1f}" if s in memcpy else "")
            rows.append(row)
        widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
        print()
        print("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |")
        print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
        for r in rows:
            print("| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |")
    print()
    print("Limits: memcpy (1 thread, GB/s of bytes copied) in the last column where measured; "
          + (f"loopback TCP (iperf3, 1 stream, 3 s): {iperf:.2f} GB/s." if iperf else "iperf3: not measured."))


if __name__ == "__main__":
    main()
