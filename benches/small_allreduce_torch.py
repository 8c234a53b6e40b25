"""Where the time of a 4-byte dist.all_reduce goes on the hccn backend (2 ranks).

    python -m torch.distributed.run --standalone --nproc-per-node 2 benches/small_allreduce_torch.py

Rank 0 prints the median over 5 rounds of 20,000 calls of each layer, from the outside in:
``dist.all_reduce`` (torch's Python function), ``ProcessGroup.allreduce`` called from Python
(pybind11, torch's dispatcher, the c10d op, its pre/post hooks, then the backend), and
torch's own cost of a trivial tensor op (``t.add_(0)``) for scale. Run it once as is and once with
TORCH_FR_BUFFER_SIZE=0 (torch attaches its FlightRecorder hook, which gathers a Python traceback
per collective, to every group of a backend that does not record itself). hccn's own latency is
hccn-perf's: ``hccnrun -n 2 hccn-perf -b 4 -e 4``. Nothing here is a test.
"""

import os
import statistics
import time

import torch
import torch.distributed as dist

import hccn.torch  # noqa: F401

dist.init_process_group("hccn")
t = torch.ones(1)
pg = dist.group.WORLD
opts = dist.AllreduceOptions()
opts.asyncOp = False


def timed(call, n=20000, rounds=5):
    for _ in range(n // 4):
        call()
    res = []
    for _ in range(rounds):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        res.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(res)


rows = [
    ("dist.all_reduce(t)", timed(lambda: dist.all_reduce(t))),
    # asyncOp False: the backend completes the operation before returning, and returns no Work.
    ("ProcessGroup.allreduce([t], opts)", timed(lambda: pg.allreduce([t], opts))),
    ("t.add_(0) (one local torch op)", timed(lambda: t.add_(0))),
]
if dist.get_rank() == 0:
    fr = os.environ.get("TORCH_FR_BUFFER_SIZE", "torch's default (on)")
    print(f"FlightRecorder buffer: {fr}")
    for what, us in rows:
        print(f"  {what:45s} {us:7.2f} us")
dist.destroy_process_group()
