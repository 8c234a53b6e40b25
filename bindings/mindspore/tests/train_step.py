"""Data-parallel MindSpore training whose gradients are averaged through hccn, compared with the
same training in one process on the whole batch (PyNative mode, CPU).

Each rank starts from its own random weights, takes rank 0's through hccn_ms.broadcast_parameters,
then runs STEPS SGD steps on its shard of a fixed global batch, with gradients averaged by
hccn_ms.GradientAverager. Alongside, every rank trains a copy of the network in-process on the
whole global batch (no hccn). Checked:
- after every step the replicas' weights are bit-identical across ranks (allgathered);
- after the last step they match the single-process network within TOL (float32 sums in another
  order: per-shard means averaged instead of one mean over the batch).

Run: PYTHONPATH=<build.sh --out> hccnrun -n 2 /opt/hccn/venvs/mindspore/bin/python train_step.py
"""

import sys

import numpy as np
import mindspore as ms
from mindspore import nn

import hccn_ms

STEPS = 8
GLOBAL_BATCH = 64
LR = 0.1
TOL = 1e-5  # max abs difference of any weight after STEPS steps

hccn_ms.init()
r, n = hccn_ms.rank(), hccn_ms.size()
assert GLOBAL_BATCH % n == 0


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Dense(8, 16, activation="tanh")
        self.l2 = nn.Dense(16, 4)

    def construct(self, x):
        return self.l2(self.l1(x))


def make_net(seed):
    ms.set_seed(seed)
    return Net()


rng = np.random.default_rng(7)
x_all = rng.standard_normal((GLOBAL_BATCH, 8)).astype(np.float32)
y_all = rng.standard_normal((GLOBAL_BATCH, 4)).astype(np.float32)
shard = GLOBAL_BATCH // n
x_mine = ms.Tensor(x_all[r * shard:(r + 1) * shard])
y_mine = ms.Tensor(y_all[r * shard:(r + 1) * shard])

gather = hccn_ms.AllGather()


def flat(net):
    return np.concatenate([p.asnumpy().reshape(-1) for p in net.trainable_params()])


def same_on_every_rank(net):
    everyone = gather(ms.Tensor(flat(net).reshape(1, -1))).asnumpy()
    return all(np.array_equal(everyone[0], everyone[k]) for k in range(n))


failed = False
net = make_net(1000 + r)  # different on every rank until the broadcast
if n > 1 and same_on_every_rank(net):
    print(f"FAIL rank {r}: the ranks' initial weights should differ before the broadcast", flush=True)
    failed = True
hccn_ms.broadcast_parameters(net.trainable_params(), root=0)
reference = make_net(0)
for p, q in zip(reference.trainable_params(), net.trainable_params()):
    p.set_data(ms.Tensor(q.asnumpy().copy()))

loss_fn = nn.MSELoss()
opt = nn.SGD(net.trainable_params(), learning_rate=LR)
ref_opt = nn.SGD(reference.trainable_params(), learning_rate=LR)
averager = hccn_ms.GradientAverager()
mean_loss = hccn_ms.AllReduce("average")


def forward(model, x, y):
    return loss_fn(model(x), y)


grad_fn = ms.value_and_grad(lambda x, y: forward(net, x, y), None, opt.parameters)
ref_grad_fn = ms.value_and_grad(lambda x, y: forward(reference, x, y), None, ref_opt.parameters)

for step in range(STEPS):
    loss, grads = grad_fn(x_mine, y_mine)
    opt(averager(grads))
    global_loss = float(mean_loss(loss.reshape(1)).asnumpy()[0])
    ref_loss, ref_grads = ref_grad_fn(ms.Tensor(x_all), ms.Tensor(y_all))
    ref_opt(ref_grads)
    if r == 0:
        print(f"step {step}: loss {global_loss:.6f} (single process {float(ref_loss.asnumpy()):.6f})", flush=True)
    if not same_on_every_rank(net):
        print(f"FAIL rank {r}: step {step}: the replicas' weights differ across ranks", flush=True)
        failed = True

diff = float(np.max(np.abs(flat(net) - flat(reference))))
if diff > TOL:
    print(f"FAIL rank {r}: max abs weight difference {diff:.3g} > {TOL}", flush=True)
    failed = True
print(f"[mindspore-train] rank {r} of {n}: {STEPS} steps, max abs difference from one process {diff:.3g} "
      f"(tolerance {TOL}){' FAILED' if failed else ' ok'}", flush=True)
sys.exit(1 if failed else 0)
