"""Where the time of a 4-byte dist.all_reduce goes (2 ranks), on hccn and on what bounds it.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        benches/small_allreduce_torch.py [--backend hccn|gloo|null]

Rank 0 prints the median over 5 rounds of 20,000 calls of each layer, from the outside in:
``dist.all_reduce`` (torch's Python function), ``ProcessGroup.allreduce`` called from Python
(pybind11, torch's dispatcher, the c10d op, its pre/post hooks, then the backend),
``Backend.allreduce`` called from Python (pybind11 straight to the backend: no dispatcher, no
hooks), and torch's own cost of a trivial tensor op (``t.add_(0)``) for scale; with each, the
calling thread's context switches per call. About 0.5 voluntary switches per call is the slow
mode of a 2-rank loop: one rank's wait outlasts hccn's spin (20 us) and sleeps, its wake-up
takes longer than the other's spin, and the two keep waking each other (~45 us more per call).

``--backend null`` is a backend that does nothing (benches/torch_floor/null_backend.cpp, built
into target/torch-floor on first use, measurement only): its figures are what torch's own layers
cost any out-of-tree backend, the floor under hccn's. Gloo's are for comparison.

Run it once as is and once with TORCH_FR_BUFFER_SIZE=0: torch attaches its FlightRecorder hook
(which gathers a Python traceback per collective) to every group of a backend it does not know
to record itself, i.e. every out-of-tree backend; Gloo records itself. hccn's own latency is
hccn-perf's: ``hccnrun -n 2 hccn-perf -b 4 -e 4 -n 20000``. Nothing here is a test.
"""

import argparse
import datetime
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))


def register_null():
    sys.path.insert(0, os.path.join(HERE, "torch_floor"))
    import build

    sys.path.insert(0, build.build())
    import torch_null_backend

    def create(opts, backend_options=None):
        return torch_null_backend.NullBackend(opts.group_rank, opts.group_size)

    dist.Backend.register_backend("null", create, extended_api=True, devices=["cpu"])


def switches():
    """This thread's context switches so far: (voluntary, involuntary)."""
    with open("/proc/thread-self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["voluntary_ctxt_switches"]), int(fields["nonvoluntary_ctxt_switches"])


def timed(call, n=20000, rounds=5):
    """Median µs per call over `rounds` rounds of `n` calls, the rounds, and the calling thread's
    voluntary and involuntary context switches per call (median over the rounds): a wait that
    sleeps (futex) shows as a voluntary one, a thread preempted by other work as an involuntary one."""
    for _ in range(n // 4):
        call()
    res, vol, invol = [], [], []
    for _ in range(rounds):
        dist.barrier()
        v0, i0 = switches()
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        res.append((time.perf_counter() - t0) / n * 1e6)
        v1, i1 = switches()
        vol.append((v1 - v0) / n)
        invol.append((i1 - i0) / n)
    return statistics.median(res), res, statistics.median(vol), statistics.median(invol)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="hccn", choices=["hccn", "gloo", "null"])
    a = p.parse_args()
    if a.backend == "hccn":
        import hccn.torch  # noqa: F401
    elif a.backend == "null":
        register_null()
    dist.init_process_group(a.backend, timeout=datetime.timedelta(seconds=120))
    t = torch.ones(1)
    pg = dist.group.WORLD
    backend = pg._get_backend(torch.device("cpu"))
    opts = dist.AllreduceOptions()
    opts.asyncOp = False

    def backend_call():
        w = backend.allreduce([t], opts)
        if w is not None:
            w.wait()

    def pg_call():
        w = pg.allreduce([t], opts)
        if w is not None:
            w.wait()

    rows = [
        ("dist.all_reduce(t)", timed(lambda: dist.all_reduce(t))),
        # asyncOp False: hccn completes the operation before returning, and returns no Work.
        ("ProcessGroup.allreduce([t], opts)", timed(pg_call)),
        ("Backend.allreduce([t], opts)", timed(backend_call)),
        ("t.add_(0) (one local torch op)", timed(lambda: t.add_(0))),
    ]
    if dist.get_rank() == 0:
        fr = os.environ.get("TORCH_FR_BUFFER_SIZE", "torch's default (on)")
        print(f"backend {a.backend}; FlightRecorder buffer: {fr}; load average {os.getloadavg()[0]:.1f}")
        for what, (us, rounds, vol, invol) in rows:
            spread = "/".join(f"{r:.1f}" for r in sorted(rounds))
            print(f"  {what:38s} {us:7.2f} us   (rounds {spread})   switches/call: {vol:.2f} vol, {invol:.2f} invol")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
