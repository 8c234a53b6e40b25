"""2-rank (or more) check of the hccn TensorFlow ops in real TensorFlow; every value is exact.

Run: PYTHONPATH=<build.sh --out> hccnrun -n 2 /opt/hccn/venvs/tf/bin/python collectives.py
Prints "[tf] rank R of N: K checks ok" and exits 0, or prints FAIL lines and exits 1.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hccn_tf  # noqa: E402

hccn_tf.init()
r, n = hccn_tf.rank(), hccn_tf.size()
checks = 0
failures = []


def check(what, got, want):
    global checks
    checks += 1
    got = np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype or not np.array_equal(got, want):
        failures.append(what)
        print(f"FAIL rank {r}: {what}: got {got!r} want {want!r}", flush=True)


tri = n * (n + 1) // 2

# Allreduce: every op, every dtype the op library maps; small integers, so exact everywhere.
for dt in [tf.int8, tf.int16, tf.int32, tf.int64, tf.uint8, tf.uint16, tf.uint32, tf.uint64,
           tf.float16, tf.bfloat16, tf.float32, tf.float64]:
    x = tf.cast(tf.range(6) + (r + 1), dt)  # rank r: i + r + 1
    base = np.arange(6)
    npdt = x.numpy().dtype
    check(f"allreduce sum {dt.name}", hccn_tf.allreduce(x).numpy(),
          (n * base + tri).astype(npdt))
    check(f"allreduce max {dt.name}", hccn_tf.allreduce(x, op="max").numpy(), (base + n).astype(npdt))
    check(f"allreduce min {dt.name}", hccn_tf.allreduce(x, op="min").numpy(), (base + 1).astype(npdt))

x = tf.constant([[1.0, 2.0], [3.0, 4.0]]) * float(r + 1)
check("allreduce prod f32", hccn_tf.allreduce(x, op="prod").numpy(),
      np.array([[1.0, 2.0], [3.0, 4.0]], np.float32) ** n * np.float32(np.prod(np.arange(1, n + 1))))
check("allreduce average f32", hccn_tf.allreduce(tf.fill([5], float(2 * r)), op="average").numpy(),
      np.full([5], float(n - 1), np.float32))
check("allreduce average int32 truncates", hccn_tf.allreduce(tf.constant([r, 1]), op="average").numpy(),
      np.array([(n * (n - 1) // 2) // n, 1], np.int32))
check("allreduce of a scalar", hccn_tf.allreduce(tf.constant(float(r))).numpy(), np.float32(n * (n - 1) / 2))
check("allreduce of an empty tensor", hccn_tf.allreduce(tf.zeros([0, 3])).numpy(), np.zeros([0, 3], np.float32))

# Allgather: first dimensions differ by rank (rank 0 gives none), the rest agree.
mine = tf.reshape(tf.range(r * 2, dtype=tf.int64), [r, 2]) + 100 * r
want = np.concatenate([np.arange(k * 2).reshape(k, 2) + 100 * k for k in range(n)]).astype(np.int64)
check("allgather of unequal first dims", hccn_tf.allgather(mine).numpy(), want)
check("allgather f64 rows", hccn_tf.allgather(tf.fill([1, 3], tf.constant(r, tf.float64))).numpy(),
      np.repeat(np.arange(n, dtype=np.float64), 3).reshape(n, 3))

# Broadcast from every root.
for root in range(n):
    got = hccn_tf.broadcast(tf.fill([2, 2], r * 7), root_rank=root).numpy()
    check(f"broadcast from {root}", got, np.full([2, 2], root * 7, np.int32))


# Inside tf.function: several independent collectives, chained in creation order.
@tf.function
def several(a, b):
    s = hccn_tf.allreduce(a)
    g = hccn_tf.allgather(tf.reshape(b, [1, -1]))
    m = hccn_tf.allreduce(b, op="max")
    c = hccn_tf.broadcast(a * 2.0, root_rank=n - 1)
    return s, g, m, c


s, g, m, c = several(tf.fill([3], float(r + 1)), tf.constant([r, -r], tf.int32))
check("tf.function allreduce", s.numpy(), np.full([3], float(tri), np.float32))
check("tf.function allgather", g.numpy(), np.array([[k, -k] for k in range(n)], np.int32))
check("tf.function max", m.numpy(), np.array([n - 1, 0], np.int32))
check("tf.function broadcast", c.numpy(), np.full([3], 2.0 * n, np.float32))

# Gradients are those of the sum of every rank's loss (Horovod's convention): the gradient of
# an allreduce is the allreduce of the incoming gradients. Here each of the n losses
# sum(allreduce(w_r * (r + 1))) gives w_r the gradient r + 1, n times over.
w = tf.Variable([1.0, 1.0])
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(hccn_tf.allreduce(w * float(r + 1)))
check("gradient through allreduce", tape.gradient(loss, w).numpy(), np.full([2], float(n * (r + 1)), np.float32))
v = tf.Variable(tf.fill([r + 1, 2], 1.0))
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(hccn_tf.allgather(v) * 2.0)
check("gradient through allgather", tape.gradient(loss, v).numpy(), np.full([r + 1, 2], 2.0 * n, np.float32))
u = tf.Variable([3.0])
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(hccn_tf.broadcast(u, root_rank=0))
check("gradient through broadcast", tape.gradient(loss, u).numpy(),
      np.array([float(n) if r == 0 else 0.0], np.float32))

# max/min/prod have no gradient here: asking for one is a clear error, raised before any
# communication (so every rank raises it alike).
x = tf.Variable([1.0])
try:
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(hccn_tf.allreduce(x, op="max"))
    tape.gradient(loss, x)
    check("gradient of a max allreduce raises", False, True)
except ValueError as e:
    check("gradient of a max allreduce message", "has no gradient" in str(e), True)

# Errors are TensorFlow errors with hccn's message, and the next op still works.
try:
    hccn_tf.allgather(tf.zeros([1, 2 + r]))  # trailing dimensions differ between ranks
    check("mismatched allgather raises", False, True)
except tf.errors.InvalidArgumentError as e:
    check("mismatched allgather message", "HccnAllgather" in str(e), True)
try:
    hccn_tf.broadcast(tf.zeros([2]), root_rank=n)  # no such rank: refused on every rank
    check("bad root raises", False, True)
except tf.errors.InvalidArgumentError as e:
    check("bad root message", "out of range" in str(e), True)
try:
    hccn_tf.allreduce(tf.constant(["a"]))
    check("string dtype raises", False, True)
except (TypeError, tf.errors.InvalidArgumentError):
    check("string dtype refused", True, True)
check("allreduce after errors", hccn_tf.allreduce(tf.constant([1])).numpy(), np.array([n], np.int32))

if failures:
    print(f"[tf] rank {r} of {n}: {len(failures)} of {checks} checks FAILED", flush=True)
    sys.exit(1)
print(f"[tf] rank {r} of {n}: {checks} checks ok", flush=True)
