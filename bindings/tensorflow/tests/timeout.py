"""hccn_tf.init(timeout_seconds=T) bounds how long a collective waits: a rank that never enters
one makes the others fail with DeadlineExceededError after T, not after HCCN_TIMEOUT_MS (which
the test sets to 120 s).

Run on 2 ranks under hccnrun:  python timeout.py SECONDS DIR
Rank 0 calls allreduce; rank 1 never does: it waits for rank 0's verdict (DIR/done), then
leaves. Both print "[tftimeout] rank r of 2: ... ok" when rank 0's wait ended as it should.
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

import hccn_tf  # noqa: E402

seconds, shared = float(sys.argv[1]), sys.argv[2]
rank = int(os.environ["HCCN_RANK"])  # hccnrun's, before joining


def wait_for(path, limit=120.0):
    end = time.monotonic() + limit
    while not os.path.exists(path):
        if time.monotonic() > end:
            sys.exit(f"rank {rank}: {path} never appeared")
        time.sleep(0.02)


# Both ranks join together: joining is bounded by the same short timeout, and a rank still
# importing TensorFlow must not count as one that never comes.
open(os.path.join(shared, f"ready-{rank}"), "w").close()
for r in range(2):
    wait_for(os.path.join(shared, f"ready-{r}"))
hccn_tf.init(timeout_seconds=seconds)
if "HCCN_TIMEOUT_MS" in os.environ and os.environ["HCCN_TIMEOUT_MS"] != "120000":
    print(f"FAIL rank {rank}: init left HCCN_TIMEOUT_MS={os.environ['HCCN_TIMEOUT_MS']}", flush=True)
if rank == 0:
    t0 = time.monotonic()
    try:
        hccn_tf.allreduce(tf.ones([4]))
        verdict = "FAIL: allreduce returned although rank 1 never entered it"
    except tf.errors.DeadlineExceededError as e:
        took = time.monotonic() - t0
        ok = seconds * 0.9 <= took < 60
        verdict = f"timed out after {took:.2f} s (timeout {seconds} s): {e.message} {'ok' if ok else 'FAILED'}"
    with open(os.path.join(shared, "done"), "w") as f:
        f.write(verdict)
else:
    wait_for(os.path.join(shared, "done"))
    with open(os.path.join(shared, "done")) as f:
        verdict = f.read()
print(f"[tftimeout] rank {rank} of {hccn_tf.size()}: {verdict}", flush=True)
sys.exit(0 if verdict.endswith(" ok") else 1)
