"""init_process_group(timeout=...) bounds the "hccn" backend's waits: a rank that never enters a
collective makes the others fail with hccn's TimeoutError (a DistBackendError) after that
timeout, not after HCCN_TIMEOUT_MS (which the test sets to 120 s).

Run on 2 ranks under torchrun or hccnrun:  python torch_timeout.py SECONDS DIR
Rank 0 calls all_reduce; rank 1 never does: it waits for rank 0's verdict (DIR/done), then
leaves. Both print "rank r of 2: ok" when rank 0's wait ended as it should.
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import hccn
import hccn.torch

seconds, shared = float(sys.argv[1]), sys.argv[2]
rank = int(os.environ["RANK"])  # torchrun's, or exported by hccn.torch under hccnrun


def wait_for(path, limit=120.0):
    end = time.monotonic() + limit
    while not os.path.exists(path):
        if time.monotonic() > end:
            sys.exit(f"rank {rank}: {path} never appeared")
        time.sleep(0.02)


# Both ranks reach init_process_group together: joining is bounded by the same short timeout,
# and a rank still importing torch must not count as one that never comes.
open(os.path.join(shared, f"ready-{rank}"), "w").close()
for r in range(2):
    wait_for(os.path.join(shared, f"ready-{r}"))
dist.init_process_group("hccn", timeout=datetime.timedelta(seconds=seconds))
n = dist.get_world_size()
if rank == 0:
    t = torch.ones(4)
    t0 = time.monotonic()
    try:
        dist.all_reduce(t)
        verdict = "FAIL: all_reduce returned although rank 1 never entered it"
    except hccn.TimeoutError as e:
        took = time.monotonic() - t0
        ok = isinstance(e, dist.DistBackendError) and seconds * 0.9 <= took < 60
        verdict = f"{'ok' if ok else 'FAIL'}: timed out after {took:.2f} s (timeout {seconds} s): {e}"
    with open(os.path.join(shared, "done"), "w") as f:
        f.write(verdict)
else:
    wait_for(os.path.join(shared, "done"))
    with open(os.path.join(shared, "done")) as f:
        verdict = f.read()
dist.destroy_process_group()
print(f"rank {rank} of {n}: {verdict}", flush=True)
sys.exit(0 if verdict.startswith("ok") else 1)
