"""2-rank (or more) check of the hccn MindSpore cells in real MindSpore (PyNative, CPU); every
value is exact.

Run: PYTHONPATH=<build.sh --out> hccnrun -n 2 /opt/hccn/venvs/mindspore/bin/python collectives.py
Prints "[mindspore] rank R of N: K checks ok" and exits 0, or prints FAIL lines and exits 1.
"""

import sys

import numpy as np
import mindspore as ms
from mindspore import ops

import hccn_ms

hccn_ms.init()
r, n = hccn_ms.rank(), hccn_ms.size()
checks = 0
failures = []


def check(what, got, want):
    global checks
    checks += 1
    got = got.asnumpy() if isinstance(got, ms.Tensor) else np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype or not np.array_equal(got, want):
        failures.append(what)
        print(f"FAIL rank {r}: {what}: got {got!r} want {want!r}", flush=True)


tri = n * (n + 1) // 2
cells = {op: hccn_ms.AllReduce(op) for op in ("sum", "prod", "max", "min", "average")}

# AllReduce: every op over the dtypes MindSpore hands to AOT kernels; small integers, exact.
for dt in [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
           np.float16, np.float32, np.float64]:
    base = np.arange(6)
    x = ms.Tensor((base + r + 1).astype(dt))
    name = np.dtype(dt).name
    check(f"allreduce sum {name}", cells["sum"](x), (n * base + tri).astype(dt))
    check(f"allreduce max {name}", cells["max"](x), (base + n).astype(dt))
    check(f"allreduce min {name}", cells["min"](x), (base + 1).astype(dt))
bf = cells["sum"](ms.Tensor(np.arange(4, dtype=np.float32) + r, dtype=ms.bfloat16))
check("allreduce sum bfloat16 keeps its dtype", bf.dtype == ms.bfloat16, True)
check("allreduce sum bfloat16", bf.float(), (n * np.arange(4) + n * (n - 1) // 2).astype(np.float32))
x = ms.Tensor(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32) * (r + 1))
check("allreduce prod f32", cells["prod"](x),
      np.array([[1.0, 2.0], [3.0, 4.0]], np.float32) ** n * np.float32(np.prod(np.arange(1, n + 1))))
check("allreduce average f32", cells["average"](ms.Tensor(np.full([5], 2.0 * r, np.float32))),
      np.full([5], float(n - 1), np.float32))
check("allreduce of a 3-d tensor", cells["sum"](ms.Tensor(np.ones([2, 3, 4], np.float32))),
      np.full([2, 3, 4], float(n), np.float32))

# AllGather along the first dimension, in rank order.
mine = ms.Tensor(np.arange(6, dtype=np.int64).reshape(2, 3) + 100 * r)
check("allgather int64", hccn_ms.AllGather()(mine),
      np.concatenate([np.arange(6).reshape(2, 3) + 100 * k for k in range(n)]).astype(np.int64))

# Broadcast from every root.
for root in range(n):
    check(f"broadcast from {root}", hccn_ms.Broadcast(root)(ms.Tensor(np.full([2, 2], 7.0 * r, np.float32))),
          np.full([2, 2], 7.0 * root, np.float32))

# Gradients: those of the sum of every rank's loss (see hccn_ms.AllReduce).
w = ms.Tensor(np.ones(2, np.float32))
check("gradient through allreduce", ms.grad(lambda w: cells["sum"](w * (r + 1)).sum())(w),
      np.full([2], float(n * (r + 1)), np.float32))
gather = hccn_ms.AllGather()
v = ms.Tensor(np.ones([2, 2], np.float32))
check("gradient through allgather", ms.grad(lambda v: (gather(v) * 2.0).sum())(v),
      np.full([2, 2], 2.0 * n, np.float32))
bcast = hccn_ms.Broadcast(0)
u = ms.Tensor(np.array([3.0], np.float32))
check("gradient through broadcast", ms.grad(lambda u: bcast(u).sum())(u),
      np.array([float(n) if r == 0 else 0.0], np.float32))

# Errors: the kernel's non-zero return raises in MindSpore, hccn's message is kept, and the
# communicator stays usable.
try:
    hccn_ms.Broadcast(n)(ms.Tensor(np.zeros([2], np.float32))).asnumpy()  # no such rank
    check("bad root raises", False, True)
except RuntimeError:
    check("bad root message", "out of range" in hccn_ms.last_error(), True)
try:
    cells["sum"](ms.Tensor(np.array([True, False]))).asnumpy()  # bool: no hccn type
    check("bool allreduce raises", False, True)
except (RuntimeError, TypeError, ValueError):
    check("bool allreduce refused", True, True)
check("allreduce after errors", cells["sum"](ms.Tensor(np.array([1], np.int32))), np.array([n], np.int32))

if failures:
    print(f"[mindspore] rank {r} of {n}: {len(failures)} of {checks} checks FAILED", flush=True)
    sys.exit(1)
print(f"[mindspore] rank {r} of {n}: {checks} checks ok", flush=True)
