"""init_process_group(timeout=...) bounds the "hccn" backend's waits: a rank that never enters a
collective makes the others fail with hccn's TimeoutError (a DistBackendError) after that
timeout, not after HCCN_TIMEOUT_MS (which the test sets to 120 s).

Run on 2 ranks under torchrun or hccnrun:  python torch_timeout.py SECONDS DIR
Rank 0 calls all_reduce; rank 1 never does: it waits for rank 0's verdict (in DIR, see
bindings/late_rank.py), then leaves. Both print "rank r of 2: ok" when rank 0's wait ended as
it should.
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import hccn
import hccn.torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from late_rank import meet, verdict  # noqa: E402 - bindings/late_rank.py

seconds, shared = float(sys.argv[1]), sys.argv[2]
rank = int(os.environ["RANK"])  # torchrun's, or exported by hccn.torch under hccnrun
meet(shared, rank, 2)
dist.init_process_group("hccn", timeout=datetime.timedelta(seconds=seconds))
n = dist.get_world_size()
if rank == 0:
    t = torch.ones(4)
    t0 = time.monotonic()
    try:
        dist.all_reduce(t)
        mine = "FAIL: all_reduce returned although rank 1 never entered it"
    except hccn.TimeoutError as e:
        took = time.monotonic() - t0
        ok = isinstance(e, dist.DistBackendError) and seconds * 0.9 <= took < 60
        mine = f"{'ok' if ok else 'FAIL'}: timed out after {took:.2f} s (timeout {seconds} s): {e}"
    said = verdict(shared, rank, mine)
else:
    said = verdict(shared, rank)  # rank 1 never enters the all_reduce
dist.destroy_process_group()
print(f"rank {rank} of {n}: {said}", flush=True)
sys.exit(0 if said.startswith("ok") else 1)
