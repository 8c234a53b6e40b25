"""MindSpore's own communication API over hccn, in PyNative or graph mode: the script is what
MindSpore's distributed documentation shows, plus `import hccn_ms` on top.

Checked, every value exactly (each rank computes what every other rank holds):
- init(), get_rank(), get_group_size(), get_local_rank(): hccn's world;
- ops.AllReduce (sum; float32 and float16), ops.AllGather (float32, float16, int32) and
  ops.Broadcast from every root, run as nn.Cells, so that graph mode compiles them;
- create_group on a subset (ranks of this rank's parity) and on every rank in reverse order:
  group ranks, rank translation, ops.AllReduce inside the group;
- an op on a group this rank is not in raises hccn_ms's message, and the world still works;
- PyNative only, mindspore.mint.distributed (which reaches the library with other reduce ops
  and dtypes): all_reduce max/min/prod and int64/float64 sums, all_gather, broadcast, new_group;
- data-parallel training, set_auto_parallel_context(DATA_PARALLEL, gradients_mean=True) with
  nn.TrainOneStepCell (whose DistributedGradReducer allreduces the gradients): after every step
  the replicas are bit-identical across ranks, and after the last step they are within TOL of the
  same training in one process on the whole batch.
The gradient allreduces are also in hccn's trace (HCCN_TRACE), which the Rust test reads.

Run: PYTHONPATH=<build.sh --out> hccnrun -n N -- python native.py pynative|graph
Prints "[mindspore-native] rank R of N (MODE): K checks ok" and the training's per-step losses,
or FAIL lines; exits 1 on any failure.
"""

import sys

import hccn_ms  # the only line a MindSpore script needs to run over hccn (first)

import numpy as np
import mindspore as ms
from mindspore import nn, ops
from mindspore.communication import (
    GlobalComm,
    create_group,
    get_group_rank_from_world_rank,
    get_group_size,
    get_local_rank,
    get_rank,
    get_world_rank_from_group_rank,
    init,
)

MODE = sys.argv[1]
STEPS = 8
GLOBAL_BATCH = 64
LR = 0.1
TOL = 1e-5  # max abs difference of any weight after STEPS steps

ms.set_context(mode={"pynative": ms.PYNATIVE_MODE, "graph": ms.GRAPH_MODE}[MODE], device_target="CPU")
init()
r, n = get_rank(), get_group_size()
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


class AllReduce(nn.Cell):
    def __init__(self, group=GlobalComm.WORLD_COMM_GROUP):
        super().__init__()
        self.op = ops.AllReduce(group=group)

    def construct(self, x):
        return self.op(x)


class AllGather(nn.Cell):
    def __init__(self):
        super().__init__()
        self.op = ops.AllGather()

    def construct(self, x):
        return self.op(x)


class Broadcast(nn.Cell):
    def __init__(self, root):
        super().__init__()
        self.op = ops.Broadcast(root)

    def construct(self, x):
        return self.op((x,))[0]


# --- the world ---------------------------------------------------------------------------------
check("rank is hccn's", r, hccn_ms.rank())
check("size is hccn's", n, hccn_ms.size())
check("local rank (one host)", get_local_rank(), r)
check("world group name", GlobalComm.WORLD_COMM_GROUP, "mccl_world_group")

tri = n * (n + 1) // 2
allreduce = AllReduce()
for dt in (np.float32, np.float16):
    base = np.arange(6)
    check(f"allreduce sum {np.dtype(dt).name}", allreduce(ms.Tensor((base + r + 1).astype(dt))),
          (n * base + tri).astype(dt))
check("allreduce of a 3-d tensor", allreduce(ms.Tensor(np.full([2, 3, 4], r + 1.0, np.float32))),
      np.full([2, 3, 4], float(tri), np.float32))

allgather = AllGather()
for dt in (np.float32, np.float16, np.int32):
    mine = (np.arange(6).reshape(2, 3) + 10 * r).astype(dt)
    check(f"allgather {np.dtype(dt).name}", allgather(ms.Tensor(mine)),
          np.concatenate([np.arange(6).reshape(2, 3) + 10 * k for k in range(n)]).astype(dt))

for root in range(n):
    check(f"broadcast from {root} float32", Broadcast(root)(ms.Tensor(np.full([3], 7.0 * r, np.float32))),
          np.full([3], 7.0 * root, np.float32))
    check(f"broadcast from {root} int32", Broadcast(root)(ms.Tensor(np.arange(4, dtype=np.int32) * (r + 1))),
          (np.arange(4) * (root + 1)).astype(np.int32))

# --- groups ------------------------------------------------------------------------------------
parity = [k for k in range(n) if k % 2 == r % 2]  # a subset: each rank creates its own parity's
name = f"hccn_parity{r % 2}"
create_group(name, parity)
check("subset group size", get_group_size(name), len(parity))
check("subset group rank", get_rank(name), parity.index(r))
check("subset allreduce", AllReduce(name)(ms.Tensor(np.full([4], r + 1.0, np.float32))),
      np.full([4], float(sum(k + 1 for k in parity)), np.float32))

reverse = list(range(n))[::-1]
create_group("hccn_reverse", reverse)
check("reversed group rank", get_rank("hccn_reverse"), n - 1 - r)
check("world rank from group rank", get_world_rank_from_group_rank("hccn_reverse", 0), n - 1)
check("group rank from world rank", get_group_rank_from_world_rank(0, "hccn_reverse"), n - 1)
check("reversed group allreduce", AllReduce("hccn_reverse")(ms.Tensor(np.arange(3, dtype=np.float32) * (r + 1))),
      (np.arange(3) * tri).astype(np.float32))

# A group this rank is not in: MindSpore hands the op to the library, which refuses by name.
other = f"hccn_parity{(r + 1) % 2}"
try:
    AllReduce(other)(ms.Tensor(np.ones([2], np.float32))).asnumpy()
    check(f"allreduce on {other} (not a member) raises", False, True)
except RuntimeError as e:
    check("non-member error names the group", f"no communication group {other}" in str(e), True)
check("world allreduce after the error", allreduce(ms.Tensor(np.ones([2], np.float32))),
      np.full([2], float(n), np.float32))

# --- mindspore.mint.distributed (PyNative API) -------------------------------------------------
if MODE == "pynative":
    import mindspore.mint.distributed as dist

    def all_reduce(x, op="sum", group=None):
        dist.all_reduce(x, op=op, group=group)
        return x

    vals = np.arange(1, 5) + r
    check("mint all_reduce max", all_reduce(ms.Tensor(vals.astype(np.float32)), "max"),
          (np.arange(1, 5) + n - 1).astype(np.float32))
    check("mint all_reduce min", all_reduce(ms.Tensor(vals.astype(np.float32)), "min"),
          np.arange(1, 5).astype(np.float32))
    check("mint all_reduce prod float64", all_reduce(ms.Tensor(vals.astype(np.float64)), "prod"),
          np.prod([np.arange(1, 5) + k for k in range(n)], axis=0).astype(np.float64))
    check("mint all_reduce sum int64", all_reduce(ms.Tensor(vals.astype(np.int64))),
          (n * np.arange(1, 5) + tri - n).astype(np.int64))
    out = [ms.Tensor(np.zeros(3, np.float32)) for _ in range(n)]
    dist.all_gather(out, ms.Tensor(np.full(3, r + 0.5, np.float32)))
    check("mint all_gather", np.stack([t.asnumpy() for t in out]),
          np.stack([np.full(3, k + 0.5, np.float32) for k in range(n)]))
    b = ms.Tensor(np.full(2, 3.0 * r, np.float32))
    dist.broadcast(b, n - 1)
    check("mint broadcast", b, np.full(2, 3.0 * (n - 1), np.float32))
    g = dist.new_group(list(range(n)))
    check("mint all_reduce on new_group", all_reduce(ms.Tensor(np.ones(2, np.float32)), group=g),
          np.full(2, float(n), np.float32))

# --- data-parallel training --------------------------------------------------------------------
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Dense(8, 16, activation="tanh")
        self.l2 = nn.Dense(16, 4)

    def construct(self, x):
        return self.l2(self.l1(x))


rng = np.random.default_rng(7)
initial = [rng.standard_normal(shape).astype(np.float32) * 0.3 for shape in [(16, 8), (16,), (4, 16), (4,)]]
x_all = rng.standard_normal((GLOBAL_BATCH, 8)).astype(np.float32)
y_all = rng.standard_normal((GLOBAL_BATCH, 4)).astype(np.float32)
assert GLOBAL_BATCH % n == 0
shard = GLOBAL_BATCH // n


def make_net():
    net = Net()
    for p, w in zip(net.trainable_params(), initial):
        p.set_data(ms.Tensor(w.copy()))
    return net


def flat(net):
    return np.concatenate([p.asnumpy().reshape(-1) for p in net.trainable_params()])


net = make_net()
train_step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), LR))
train_step.set_train()
check("TrainOneStepCell has MindSpore's gradient reducer", type(train_step.grad_reducer).__name__,
      "DistributedGradReducer")
x_mine = ms.Tensor(x_all[r * shard : (r + 1) * shard])
y_mine = ms.Tensor(y_all[r * shard : (r + 1) * shard])
gather_weights = AllGather()
mean_loss = AllReduce()
for step in range(STEPS):
    loss = train_step(x_mine, y_mine)
    global_loss = float(mean_loss(loss.reshape(1)).asnumpy()[0]) / n
    if r == 0:
        print(f"step {step}: loss {global_loss:.6f}", flush=True)
    everyone = gather_weights(ms.Tensor(flat(net).reshape(1, -1))).asnumpy()
    check(f"step {step}: replicas equal on every rank", all(np.array_equal(everyone[0], w) for w in everyone), True)

# The same training in one process, on the whole batch, with no reducer.
reference = make_net()
ref_opt = nn.SGD(reference.trainable_params(), LR)


def ref_forward(x, y):
    return nn.MSELoss()(reference(x), y)


ref_grad = ms.value_and_grad(ref_forward, None, ref_opt.parameters)
for step in range(STEPS):
    _, grads = ref_grad(ms.Tensor(x_all), ms.Tensor(y_all))
    ref_opt(grads)
diff = float(np.max(np.abs(flat(net) - flat(reference))))
check(f"within {TOL} of one process", diff <= TOL, True)
print(f"[mindspore-native] rank {r}: {STEPS} steps, max abs difference from one process {diff:.3g}", flush=True)

if failures:
    print(f"[mindspore-native] rank {r} of {n} ({MODE}): {len(failures)} of {checks} checks FAILED", flush=True)
    sys.exit(1)
print(f"[mindspore-native] rank {r} of {n} ({MODE}): {checks} checks ok", flush=True)
