"""hccn_tf.init(timeout_seconds=T) bounds how long a collective waits: a rank that never enters
one makes the others fail with DeadlineExceededError after T, not after HCCN_TIMEOUT_MS (which
the test sets to 120 s).

Run on 2 ranks under hccnrun:  python timeout.py SECONDS DIR
Rank 0 calls allreduce; rank 1 never does: it waits for rank 0's verdict (in DIR, see
bindings/late_rank.py), then leaves. Both print "[tftimeout] rank r of 2: ... ok" when rank 0's
wait ended as it should.
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

import hccn_tf  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from late_rank import meet, verdict  # noqa: E402 - bindings/late_rank.py

seconds, shared = float(sys.argv[1]), sys.argv[2]
rank = int(os.environ["HCCN_RANK"])  # hccnrun's, before joining
meet(shared, rank, 2)
hccn_tf.init(timeout_seconds=seconds)
if os.environ.get("HCCN_TIMEOUT_MS") != "120000":
    print(f"FAIL rank {rank}: init left HCCN_TIMEOUT_MS={os.environ.get('HCCN_TIMEOUT_MS')}", flush=True)
if rank == 0:
    t0 = time.monotonic()
    try:
        hccn_tf.allreduce(tf.ones([4]))
        mine = "FAIL: allreduce returned although rank 1 never entered it"
    except tf.errors.DeadlineExceededError as e:
        took = time.monotonic() - t0
        ok = seconds * 0.9 <= took < 60
        mine = f"timed out after {took:.2f} s (timeout {seconds} s): {e.message} {'ok' if ok else 'FAILED'}"
    said = verdict(shared, rank, mine)
else:
    said = verdict(shared, rank)  # rank 1 never enters the allreduce
print(f"[tftimeout] rank {rank} of {hccn_tf.size()}: {said}", flush=True)
sys.exit(0 if said.endswith(" ok") else 1)
