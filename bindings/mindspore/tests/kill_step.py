"""A rank killed mid-training: the survivors' MindSpore step must raise hccn's RANK_FAILED.

Data-parallel training over hccn (import hccn_ms, init(), DATA_PARALLEL); at step KILL_AT the
last rank waits a second (the others block in the step's allreduce), prints the time and
SIGKILLs itself. The survivors' gradient allreduce fails as soon as
hccn sees the dead peer's socket close; each survivor prints when its step raised and with what.
STYLE:
- "ops": PyNative, gradients allreduced op by op with ops.AllReduce (MindSpore launches each
  collective on its own);
- "graph": graph mode, nn.TrainOneStepCell (MindSpore's DistributedGradReducer inside the
  compiled step). MindSpore's graph runner waits a fixed 3 s after any failed kernel before it
  raises (GraphScheduler::Run; see bindings/mindspore/README.md).

Run: PYTHONPATH=<build.sh --out> hccnrun -n N --grace 30 -- python kill_step.py ops|graph
Prints "[killed] rank R at T" (the victim) and "[raised] rank R step S at T: MESSAGE" (each
survivor; T is time.time()); a survivor whose step never raises prints "[finished]" and exits 1.
"""

import os
import signal
import sys
import time

import hccn_ms  # noqa: F401 - hccn under MindSpore's communication API

import numpy as np
import mindspore as ms
from mindspore import nn, ops
from mindspore.communication import get_group_size, get_rank, init

STYLE = sys.argv[1]
KILL_AT = 3
STEPS = 200

ms.set_context(mode=ms.GRAPH_MODE if STYLE == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
init()
r, n = get_rank(), get_group_size()
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)

net = nn.Dense(8, 4)
opt = nn.SGD(net.trainable_params(), 0.01)
x = ms.Tensor(np.full((4, 8), 0.1 * (r + 1), np.float32))
y = ms.Tensor(np.zeros((4, 4), np.float32))

if STYLE == "graph":
    train_step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), opt)

    def step():
        return train_step(x, y).asnumpy()

else:
    grad_fn = ms.value_and_grad(lambda a, b: nn.MSELoss()(net(a), b), None, opt.parameters)
    allreduce = ops.AllReduce()

    def step():
        loss, grads = grad_fn(x, y)
        opt(tuple(allreduce(g) / n for g in grads))
        return loss.asnumpy()


for s in range(STEPS):
    if s == KILL_AT and r == n - 1:
        # Let the survivors reach the step's allreduce first, so that what is measured is how
        # long a failure takes to surface, not how long their forward pass took.
        time.sleep(1.0)
        print(f"[killed] rank {r} at {time.time():.3f}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        step()
    except RuntimeError as e:
        message = " ".join(str(e).split())
        print(f"[raised] rank {r} step {s} at {time.time():.3f}: {message}", flush=True)
        sys.exit(0)
print(f"[finished] rank {r}: {STEPS} steps and no error", flush=True)
sys.exit(1)
