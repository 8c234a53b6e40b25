"""Tables of benches/compare.sh's every-collective sweep: hccn latency / Open MPI latency.

Usage: python3 colls_table.py DIR [--doc FILE --command CMD]

Reads DIR/colls-{hccn,mpi}-{shm,tcp}-np{N}-sweep{K}.txt, the output of benches/compare/colls.c
(one line per cell: "op bytes calls us_1 ... us_R ok|WRONG", possibly behind hccnrun's "[0] ").
A cell's latency is the median of all its repetitions over the sweeps; its ratio is hccn's
median over Open MPI's. Under each transport's tables, the cells above 1.10 are sorted by cause
(see `why`): a rooted call's round that Open MPI's root does not wait for, sweeps that disagree,
or not explained. Prints all this; with --doc, also replaces the text between the
markers below in FILE (appending a section with the markers when FILE has none).
"""
import datetime
import glob
import os
import re
import statistics
import subprocess
import sys

BEGIN = "<!-- compare:colls begin -->"
END = "<!-- compare:colls end -->"
OPS = ["allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall", "reduce", "gather", "scatter"]
LOSE, LOSE_CLEARLY = 1.0, 1.10
# Collectives whose data flows from or to one root: Open MPI's root returns once its data is sent
# (or its blocks are in), hccn's every rank waits until it has seen that every rank's call matches
# (the verification round of runtime/src/collectives/verify.rs, or one board round).
ROOTED = ("broadcast", "reduce", "gather", "scatter")
# An Open MPI rooted call cheaper than this share of its own allreduce of the same size did not
# wait for a round.
NO_ROUND = 0.7
# hccn's extra time on such a call is put down to its round when it is at most this many times
# hccn's smallest allreduce (one round, latency only).
ROUND_SLACK = 1.5
# A cell is unsteady when the ratio of one sweep and the other's differ by more than this factor.
UNSTEADY = 1.15
NAME = re.compile(r"colls-(hccn|mpi)-(shm|tcp)-np(\d+)-sweep(\d+)\.txt$")


def read(d):
    """{(lib, transport, n): {(op, bytes): {"us": [...], "by_sweep": {k: [...]}, "wrong": bool}}}"""
    runs = {}
    for path in sorted(glob.glob(os.path.join(d, "colls-*.txt"))):
        m = NAME.search(path)
        if not m:
            continue
        lib, transport, n, sweep = m.group(1), m.group(2), int(m.group(3)), int(m.group(4))
        cells = runs.setdefault((lib, transport, n), {})
        for line in open(path):
            f = line.split()
            if f and re.fullmatch(r"\[\d+\]", f[0]):
                f = f[1:]
            if len(f) < 5 or f[0] not in OPS:
                continue
            c = cells.setdefault((f[0], int(f[1])), {"us": [], "by_sweep": {}, "wrong": False})
            times = [float(x) for x in f[3:-1]]
            c["us"] += times
            c["by_sweep"].setdefault(sweep, []).extend(times)
            c["wrong"] |= f[-1] != "ok"
    return runs


def label(b):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k} {unit}"
    return f"{b} B"


def fmt_us(t):
    if t < 10:
        return f"{t:.2f}"
    if t < 1000:
        return f"{t:.1f}"
    return f"{t:,.0f}"


def markdown(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def ratio_cell(h, m):
    """The ratio text for cells h (hccn) and m (mpi), and the ratio (None when there is none)."""
    if h is None or m is None:
        return "missing", None
    if h["wrong"] or m["wrong"]:
        who = "+".join(x for x, c in (("hccn", h), ("mpi", m)) if c["wrong"])
        return f"WRONG ({who})", None
    r = statistics.median(h["us"]) / statistics.median(m["us"])
    if r > LOSE_CLEARLY:
        return f"**{r:.2f}**", r
    if r > LOSE:
        return f"*{r:.2f}*", r
    return f"{r:.2f}", r


def unsteady(h, m):
    """Whether the sweeps disagree: per-sweep ratios further apart than UNSTEADY."""
    ratios = sweep_ratios(h, m)
    return len(ratios) > 1 and max(ratios) / min(ratios) > UNSTEADY


def sweep_ratios(h, m):
    return [statistics.median(h["by_sweep"][k]) / statistics.median(m["by_sweep"][k])
            for k in h["by_sweep"] if k in m["by_sweep"]]


def why(losers, h_cells, m_cells):
    """Sorts the cells above LOSE_CLEARLY of one rank count by cause: [(n, op, bytes, cause, detail)].

    "round": a rooted call where Open MPI's did not wait for a round (it cost less than NO_ROUND
    of its own allreduce of that size) and hccn's extra time is about one round (at most
    ROUND_SLACK times hccn's smallest allreduce); "noise": a sweep put the cell at or below
    LOSE_CLEARLY; "open": neither."""
    smallest = min((b for op, b in h_cells if op == "allreduce"), default=None)
    med = lambda c: statistics.median(c["us"])
    one_round = med(h_cells[("allreduce", smallest)]) if smallest is not None else None
    out = []
    for n, op, b, h, m in losers:
        ma = m_cells.get(("allreduce", b))
        no_round = op in ROOTED and ma is not None and med(m) < NO_ROUND * med(ma)
        if no_round and one_round is not None and med(h) - med(m) <= ROUND_SLACK * one_round:
            out.append((n, op, b, "round", (med(h) - med(m), one_round)))
        elif min(ratios := sweep_ratios(h, m), default=LOSE_CLEARLY + 1) <= LOSE_CLEARLY:
            out.append((n, op, b, "noise", ratios))
        else:
            out.append((n, op, b, "open", (med(h), med(m))))
    return out


def causes(sorted_losers):
    """Markdown bullets: why the cells above LOSE_CLEARLY lose, grouped by cause."""
    if not sorted_losers:
        return ""
    name = lambda n, op, b: f"np{n} {op} {label(b)}"
    lines = [f"Why the cells above {LOSE_CLEARLY:.2f} lose (sorted by `benches/compare/colls_table.py`):", ""]
    for n in sorted({x[0] for x in sorted_losers if x[3] == "round"}):
        rounds = [x for x in sorted_losers if x[3] == "round" and x[0] == n]
        extra = [d[0] for *_, d in rounds]
        lines.append(
            f"- **np{n}: a round where Open MPI has none** ({len(rounds)}: "
            + ", ".join(name(n, op, b) for n, op, b, *_ in rounds)
            + f"). Open MPI's root returns once its data is sent, without hearing from the other ranks "
            f"(each of these calls cost it less than {NO_ROUND} of its own allreduce of the same size). "
            "An hccn rooted call ends only when the rank has seen that every rank made the same call "
            "(`runtime/src/collectives/verify.rs`, or the board's one round), so that a mismatched call "
            "fails on every rank (HCCN_ERROR_MISMATCH) instead of succeeding on some. hccn's extra time "
            f"per call here, {fmt_us(min(extra))}–{fmt_us(max(extra))} µs, is about that round "
            f"(its smallest allreduce: {fmt_us(rounds[0][4][1])} µs).")
    noise = [x for x in sorted_losers if x[3] == "noise"]
    if noise:
        lines.append(
            f"- **The sweeps disagree** ({len(noise)}): "
            + ", ".join(f"{name(n, op, b)} ({' and '.join(f'{r:.2f}' for r in d)})" for n, op, b, _, d in noise)
            + f"; one sweep put the cell at or below {LOSE_CLEARLY:.2f}.")
    open_ = [x for x in sorted_losers if x[3] == "open"]
    if open_:
        lines.append(
            f"- **Not explained here** ({len(open_)}): "
            + ", ".join(f"{name(n, op, b)} ({fmt_us(d[0])} µs against {fmt_us(d[1])})" for n, op, b, _, d in open_)
            + ".")
    return "\n".join(lines)


def tables(runs, transport):
    """Markdown of the ratio table and the latency table for one transport, and its summary."""
    ns = sorted(n for lib, t, n in runs if t == transport and lib == "hccn" and (("mpi", t, n) in runs))
    if not ns:
        return None
    sizes = sorted({b for key, cells in runs.items() if key[1] == transport for _, b in cells})
    head = ["hccn / Open MPI"] + [label(b) for b in sizes]
    ratio_rows, abs_rows = [], []
    counted = lose = lose_clearly = shaky = 0
    bad, sorted_losers = [], []
    for n in ns:
        h_cells, m_cells = runs[("hccn", transport, n)], runs[("mpi", transport, n)]
        for op in OPS:
            if not any((op, b) in h_cells or (op, b) in m_cells for b in sizes):
                continue
            row, hrow, mrow = [f"np{n} {op}"], [f"np{n} {op} hccn"], [f"np{n} {op} Open MPI"]
            losers = []
            for b in sizes:
                h, m = h_cells.get((op, b)), m_cells.get((op, b))
                text, r = ratio_cell(h, m)
                if r is None:
                    bad.append(f"np{n} {op} {label(b)}: {text}")
                else:
                    counted += 1
                    lose += r > LOSE
                    lose_clearly += r > LOSE_CLEARLY
                    if r > LOSE_CLEARLY:
                        losers.append((n, op, b, h, m))
                    if unsteady(h, m):
                        shaky += 1
                        text += "~"
                row.append(text)
                hrow.append(fmt_us(statistics.median(h["us"])) if h else "-")
                mrow.append(fmt_us(statistics.median(m["us"])) if m else "-")
            ratio_rows.append(row)
            abs_rows += [hrow, mrow]
            sorted_losers += why(losers, h_cells, m_cells)
    summary = (f"{lose_clearly} of {counted} cells above {LOSE_CLEARLY:.2f} (bold), {lose} above "
               f"{LOSE:.1f} (bold or italic); {shaky} marked ~ where the sweeps' own ratios differ "
               f"by more than {round((UNSTEADY - 1) * 100)} %.")
    if bad:
        summary += " Not compared: " + "; ".join(bad) + "."
    absolute = markdown(["latency µs"] + [label(b) for b in sizes], abs_rows)
    return markdown(head, ratio_rows), absolute, summary, causes(sorted_losers)


def git(*args):
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def section(runs, d, command):
    mpi = "Open MPI"
    try:
        mpi = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
        mpi = mpi.replace("mpirun (Open MPI)", "Open MPI")
    except (OSError, IndexError):
        pass
    sweeps = sorted({int(NAME.search(p).group(4)) for p in glob.glob(os.path.join(d, "colls-*.txt"))
                     if NAME.search(p)})
    reps = "?"
    for p in glob.glob(os.path.join(d, "colls-*.txt")):
        for line in open(p):
            m = re.search(r"reps=(\d+) rep_seconds=(\S+)", line)
            if m:
                reps = f"{m.group(1)} repetitions of ~{m.group(2)} s"
                break
    load_path = os.path.join(d, "load.txt")
    load = " → ".join(open(load_path).read().split("\n")).strip(" →") if os.path.exists(load_path) else "?"
    dirty = " (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs/algorithms.md") else ""
    out = [BEGIN,
           f"Measured {datetime.date.today().isoformat()} at HEAD `{git('rev-parse', '--short', 'HEAD')}`{dirty} "
           f"by `{command}` on {os.cpu_count()} cores against {mpi} (load average before → after the sweeps: {load}).",
           "",
           "Method: one timing loop, `benches/compare/colls.c`, compiled for hccn's C ABI (ranks started "
           "by `hccnrun`) and for MPI (`mpirun --oversubscribe --mca pml ob1`); both placed as mpirun "
           "places ranks by default: a core each for 2 ranks (`hccnrun --bind-to core`), unbound for 4. "
           "fp32, sum, root 0, heap buffers. S (the column) is each rank's send buffer for allreduce, "
           "broadcast, reduce and alltoall (n blocks of S/n), each rank's contribution for allgather "
           "and gather (the root receives n·S), each rank's whole input for reduce_scatter (it receives S/n) "
           "and the root's send buffer for scatter (n blocks of S/n). "
           f"Per cell: warm-up, then {reps} (calls scaled by size), each after a barrier, timing "
           "the slowest rank's mean per call; then one call checked element by element. "
           f"A cell is the median of all {len(sweeps)}×{reps.split()[0]} repetitions of "
           f"{len(sweeps)} sweeps; each collective is a run of its own, hccn's and Open MPI's back to back, "
           "alternating which goes first. "
           f"Ratio = hccn latency / Open MPI latency: **bold** above {LOSE_CLEARLY:.2f}, *italic* above "
           f"{LOSE:.1f}; ~ marks a cell whose two sweeps disagree (noise).",
           ""]
    for transport, title in (("shm", "Shared memory (hccn's default; Open MPI `--mca btl self,vader`)"),
                             ("tcp", "TCP (`HCCN_TRANSPORT=tcp`; Open MPI `--mca btl self,tcp`, loopback)")):
        t = tables(runs, transport)
        if t is None:
            continue
        ratio, absolute, summary, why_lost = t
        out += [f"**{title}:** {summary}", "", ratio, "", "Latencies (µs, median):", "", absolute, ""]
        if why_lost:
            out += [why_lost, ""]
    out.append(END)
    return "\n".join(out)


def write_doc(path, text):
    doc = open(path).read() if os.path.exists(path) else ""
    if BEGIN in doc and END in doc:
        head, rest = doc.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        doc = head + text + tail
    else:
        doc = doc.rstrip("\n") + "\n\n## Every collective beside Open MPI\n\n" \
            "Written by `benches/compare.sh` (its every-collective sweep) between the markers; " \
            "do not edit by hand.\n\n" + text + "\n"
    open(path, "w").write(doc)


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    d, doc, command = args[0], None, "bash benches/compare.sh"
    rest = args[1:]
    while rest:
        if rest[0] == "--doc" and len(rest) > 1:
            doc = rest[1]
        elif rest[0] == "--command" and len(rest) > 1:
            command = rest[1]
        else:
            sys.exit(f"colls_table.py: unknown argument {rest[0]}\n{__doc__}")
        rest = rest[2:]
    runs = read(d)
    if not runs:
        sys.exit(f"colls_table.py: no colls-*.txt results in {d}")
    text = section(runs, d, command)
    print(text.replace(BEGIN + "\n", "").replace("\n" + END, ""))
    if doc:
        write_doc(doc, text)
        print(f"\n(written to {doc})")


if __name__ == "__main__":
    main()
