"""The hccn_ms ops.Custom cells (what MindSpore's own CPU kernels refuse) in real MindSpore, in
PyNative or graph mode; every value is exact.

Checked: AllReduce with every op over the dtypes MindSpore hands to AOT kernels, ReduceScatter
(no CPU kernel in MindSpore) with every op, AllGather and Broadcast, the cells' gradients, their
errors, and a cell and MindSpore's own ops.AllReduce in one network (one world communicator,
one lock, one order).

Run: PYTHONPATH=<build.sh --out> hccnrun -n N -- python cells.py pynative|graph
Prints "[mindspore-cells] rank R of N (MODE): K checks ok" and exits 0, or FAIL lines and exits 1.
"""

import sys

import hccn_ms

import numpy as np
import mindspore as ms
from mindspore import nn, ops
from mindspore.communication import init

MODE = sys.argv[1]
ms.set_context(mode={"pynative": ms.PYNATIVE_MODE, "graph": ms.GRAPH_MODE}[MODE], device_target="CPU")
hccn_ms.init()
init()  # MindSpore's own, for the ops.AllReduce that shares the network with a cell below
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

# ReduceScatter: rank q's input block k (rows 2k, 2k+1) goes to rank k, reduced over q.
ops_want = {
    "sum": lambda b: n * b + n * (n - 1) // 2,
    "max": lambda b: b + n - 1,
    "min": lambda b: b,
    "average": lambda b: b + (n - 1) / 2,
}
rows = np.arange(2 * n).reshape(-1, 1)
block = (rows // 2 + rows % 2 + np.arange(3)).astype(np.int64)  # (2n, 3): what every rank holds
mine = block[2 * r : 2 * r + 2]
for op, want in ops_want.items():
    dts = [np.float32, np.float64] if op == "average" else [np.int32, np.int64, np.float16, np.float32]
    for dt in dts:
        got = hccn_ms.ReduceScatter(op)(ms.Tensor((block + r).astype(dt)))
        check(f"reduce_scatter {op} {np.dtype(dt).name}", got, np.asarray(want(mine)).astype(dt))
check("reduce_scatter prod", hccn_ms.ReduceScatter("prod")(ms.Tensor(np.full([n, 2], r + 1, np.int32))),
      np.full([1, 2], np.prod(np.arange(1, n + 1)), np.int32))

# AllGather along the first dimension, in rank order.
mine = ms.Tensor(np.arange(6, dtype=np.int64).reshape(2, 3) + 100 * r)
check("allgather int64", hccn_ms.AllGather()(mine),
      np.concatenate([np.arange(6).reshape(2, 3) + 100 * k for k in range(n)]).astype(np.int64))

# Broadcast from every root.
for root in range(n):
    check(f"broadcast from {root}", hccn_ms.Broadcast(root)(ms.Tensor(np.full([2, 2], 7.0 * r, np.float32))),
          np.full([2, 2], 7.0 * root, np.float32))

# Gradients: those of the sum of every rank's loss (see hccn_ms.AllReduce).
gather = hccn_ms.AllGather()
bcast = hccn_ms.Broadcast(0)


def through_allreduce(w):
    return cells["sum"](w * (r + 1)).sum()


def through_allgather(v):
    return (gather(v) * 2.0).sum()


def through_broadcast(u):
    return bcast(u).sum()


check("gradient through allreduce", ms.grad(through_allreduce)(ms.Tensor(np.ones(2, np.float32))),
      np.full([2], float(n * (r + 1)), np.float32))
check("gradient through allgather", ms.grad(through_allgather)(ms.Tensor(np.ones([2, 2], np.float32))),
      np.full([2, 2], 2.0 * n, np.float32))
check("gradient through broadcast", ms.grad(through_broadcast)(ms.Tensor(np.array([3.0], np.float32))),
      np.array([float(n) if r == 0 else 0.0], np.float32))


# A cell and MindSpore's own collective in one network: both on hccn's world communicator.
class Mixed(nn.Cell):
    def __init__(self):
        super().__init__()
        self.native_sum = ops.AllReduce()
        self.cell_max = hccn_ms.AllReduce("max")

    def construct(self, x):
        return self.cell_max(self.native_sum(x) * (r + 1))


check("cell after ops.AllReduce", Mixed()(ms.Tensor(np.full([3], 1.0, np.float32))),
      np.full([3], float(n * n), np.float32))

# Errors: the kernel's non-zero return raises in MindSpore, hccn's message is kept, and the
# communicator stays usable. The path is the same in both modes; in graph mode each failed kernel
# costs MindSpore's fixed 3 s wait (see the README), so it runs in PyNative only.
if MODE == "pynative":
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
    print(f"[mindspore-cells] rank {r} of {n} ({MODE}): {len(failures)} of {checks} checks FAILED", flush=True)
    sys.exit(1)
print(f"[mindspore-cells] rank {r} of {n} ({MODE}): {checks} checks ok", flush=True)
