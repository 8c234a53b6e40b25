"""hccn.torchft.ProcessGroupHccn without a Lighthouse: what torchft's Manager asks of a process
group, driven directly on 3 ranks (torchrun, or hccnrun: the store at MASTER_ADDR:MASTER_PORT).

    python -m torch.distributed.run --standalone --nproc-per-node 3 torchft_pg.py [CHANGES]

1. every operation the Manager and its healing use, with exact values;
2. CHANGES (default 200) quorum changes (``configure``), every fourth without the last rank, an
   allreduce on each: descriptors and threads of the process no more after the last than after
   the twelfth (the same kind of quorum); the configure times are printed;
3. ``abort()`` while an allreduce waits for a rank that never comes: the wait returns False at
   once, on the rank that aborted and on the one it left; ``errored()`` says why; later
   collectives fail without raising, transfers raise; the next configuration works;
4. a rank stuck in user code: the others' waits end at the group's timeout (``set_timeout``),
   with False and a timeout in ``errored()``; the next configuration works.

Every rank prints "rank r of n: ok" at the end.
"""

import datetime
import gc
import os
import statistics
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

import hccn
from hccn.torchft import ProcessGroupHccn

RANK, N = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
ADDR, PORT = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
LONG = datetime.timedelta(seconds=60)
SIGNALS = dist.TCPStore(ADDR, PORT, is_master=False, wait_for_workers=False, timeout=LONG)


def check(cond, what):
    if not cond:
        print(f"FAIL rank {RANK}: {what}", flush=True)
        sys.exit(1)


def configure(pg, quorum, rank=RANK, size=N):
    pg.configure(f"{ADDR}:{PORT}/torchft-test/{quorum}", f"replica_{RANK}", rank, size, quorum)


def every_operation(pg):
    r, n = RANK, N
    t = torch.full((5,), float(r + 1))
    check(pg.allreduce([t], c10d.AllreduceOptions()).wait() and (t == n * (n + 1) / 2).all(), f"allreduce {t}")
    a, b = torch.full((3,), float(r)), torch.full((2, 2), float(2 * r))
    check(pg.allreduce_coalesced([a, b], c10d.AllreduceCoalescedOptions()).wait(), "allreduce_coalesced")
    check((a == n * (n - 1) / 2).all() and (b == n * (n - 1)).all(), f"allreduce_coalesced {a} {b}")
    outs = [torch.empty(4) for _ in range(n)]
    check(pg.allgather([outs], [torch.full((4,), float(r))], c10d.AllgatherOptions()).wait(), "allgather")
    check(all((o == i).all() for i, o in enumerate(outs)), f"allgather {outs}")
    flat = [torch.empty(3 * n), torch.empty(2 * n, dtype=torch.int64)]
    ins = [torch.arange(3.0) + 10 * r, torch.full((2,), r, dtype=torch.int64)]
    check(pg.allgather_into_tensor_coalesced(flat, ins, c10d.AllgatherOptions()).wait(), "allgather_into_tensor_coalesced")
    want = torch.cat([torch.arange(3.0) + 10 * i for i in range(n)])
    check((flat[0] == want).all() and (flat[1] == torch.arange(n).repeat_interleave(2)).all(), f"allgather_into {flat}")
    opts = c10d.BroadcastOptions()
    opts.rootRank = n - 1
    t = torch.full((6,), float(r))
    check(pg.broadcast([t], opts).wait() and (t == n - 1).all(), f"broadcast {t}")
    check(pg.barrier(c10d.BarrierOptions()).wait(), "barrier")
    src = torch.arange(2 * n, dtype=torch.float32) + 100 * r
    dst = torch.empty(2 * n)
    check(pg.alltoall_base(dst, src, [], [], c10d.AllToAllOptions()).wait(), "alltoall_base")
    want = torch.cat([torch.arange(2 * r, 2 * r + 2, dtype=torch.float32) + 100 * i for i in range(n)])
    check((dst == want).all(), f"alltoall_base {dst}")
    out = torch.empty(3)
    ins = [torch.full((3,), float(r + i)) for i in range(n)]
    check(pg.reduce_scatter([out], [ins], c10d.ReduceScatterOptions()).wait(), "reduce_scatter")
    check((out == sum(i + r for i in range(n))).all(), f"reduce_scatter {out}")
    outs = [torch.empty(2), torch.empty(1)]
    ins = [torch.arange(2.0 * n) * (r + 1), torch.ones(n)]
    check(pg.reduce_scatter_tensor_coalesced(outs, ins, c10d.ReduceScatterOptions()).wait(), "rs_coalesced")
    tri = n * (n + 1) / 2
    check((outs[0] == torch.tensor([2.0 * r, 2.0 * r + 1]) * tri).all() and (outs[1] == n).all(), f"rs_coalesced {outs}")
    got = torch.empty(7)
    recv = pg.recv([got], (r - 1) % n, 5)
    check(pg.send([torch.full((7,), float(r))], (r + 1) % n, 5).wait(), "send")
    check(recv.wait() and (got == (r - 1) % n).all(), f"recv {got}")
    check(pg.errored() is None, f"errored() on a healthy group: {pg.errored()}")
    check(pg.getBackendName() == "torchft-hccn" and pg.size() == n, "name and size")


def census():
    gc.collect()
    return len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task"))


def quorum_changes(pg, changes):
    times, at_12 = [], None
    for q in range(1, changes + 1):
        out = q % 4 == 0  # every fourth quorum goes on without the last rank
        if not (out and RANK == N - 1):
            size = N - 1 if out else N
            t0 = time.perf_counter()
            configure(pg, q, RANK, size)
            times.append(time.perf_counter() - t0)
            t = torch.ones(2)
            check(pg.allreduce([t], c10d.AllreduceOptions()).wait() and (t == size).all(), f"quorum {q}: {t}")
        if q == 12:
            at_12 = census()
    SIGNALS.add("changes-done", 1)
    wait_count("changes-done", N)
    last = census()
    print(f"rank {RANK}: fds, threads after 12 quorum changes {at_12}, after {changes} {last}", flush=True)
    ms = sorted(1e3 * x for x in times)
    print(
        f"rank {RANK}: configure ms median {statistics.median(ms):.2f} p90 {ms[int(0.9 * len(ms))]:.2f} max {ms[-1]:.2f}",
        flush=True,
    )
    # A connection may be closing at either moment: one descriptor of slack, none for threads.
    check(
        last[0] <= at_12[0] + 1 and last[1] <= at_12[1],
        f"descriptors or threads grew: {at_12} after 12 quorum changes, {last} after {changes}",
    )


def wait_count(key, want):
    while int(SIGNALS.add(key, 0)) < want:
        time.sleep(0.01)


def abort_in_flight(pg, q):
    """Ranks 0 and 1 allreduce; the last rank never comes; rank 0 aborts after 0.3 s."""
    configure(pg, q)
    if RANK == N - 1:
        wait_count("abort-done", N - 1)
    else:
        t = torch.ones(4)
        work = pg.allreduce([t], c10d.AllreduceOptions())
        if RANK == 0:
            threading.Timer(0.3, pg.abort).start()
        t0 = time.monotonic()
        ok = work.wait()
        took = time.monotonic() - t0
        check(not ok, "a wait that an abort ended returns False")
        check(took < 10, f"the abort ended the wait after {took:.2f} s, not at once")
        err = pg.errored()
        check(isinstance(err, hccn.HccnError), f"errored() after the abort: {err!r}")
        print(f"rank {RANK}: wait ended {took:.3f} s after the allreduce, errored: {type(err).__name__}", flush=True)
        if RANK == 0:
            time.sleep(0.1)  # the timer's abort has returned
            check(not pg.allreduce([t], c10d.AllreduceOptions()).wait(), "a collective after abort returns False")
            try:
                pg.recv([t], 1, 0)
                check(False, "a receive after abort raises")
            except hccn.HccnError:
                pass
        SIGNALS.add("abort-done", 1)


def stuck_peer(pg, q):
    """The last rank sleeps in user code; the others' waits end at the group's timeout."""
    configure(pg, q)
    if RANK == N - 1:
        wait_count("stuck-done", N - 1)
        return
    pg.set_timeout(datetime.timedelta(seconds=1))
    t0 = time.monotonic()
    ok = pg.allreduce([torch.ones(4)], c10d.AllreduceOptions()).wait()
    took = time.monotonic() - t0
    pg.set_timeout(LONG)
    err = pg.errored()
    check(not ok and isinstance(err, hccn.HccnError), f"a wait past the timeout: {ok} {err!r}")
    print(f"rank {RANK}: stuck peer: wait ended after {took:.2f} s ({type(err).__name__})", flush=True)
    SIGNALS.add("stuck-done", 1)


def main():
    changes = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    pg = ProcessGroupHccn(timeout=LONG)
    check(pg.errored() is None, "errored() before any configuration")
    configure(pg, 0)
    every_operation(pg)
    quorum_changes(pg, changes)
    abort_in_flight(pg, changes + 1)
    stuck_peer(pg, changes + 2)
    configure(pg, changes + 3)
    every_operation(pg)
    pg.shutdown()
    print(f"rank {RANK} of {N}: ok", flush=True)


if __name__ == "__main__":
    main()
