"""torchft's DDP training over hccn: replica groups that come and go while training goes on.

    torchft_lighthouse --min_replicas 1 --quorum_tick_ms 100 --join_timeout_ms 10000 \\
        --heartbeat_timeout_ms 1000 --bind 127.0.0.1:29510 &
    export TORCHFT_LIGHTHOUSE=http://127.0.0.1:29510
    REPLICA_GROUP_ID=0 hccnrun -n 1 python examples/torchft/train_ddp.py &
    REPLICA_GROUP_ID=1 python -m torch.distributed.run --standalone --nproc-per-node 1 \\
        examples/torchft/train_ddp.py

One Lighthouse for the job; each replica group is started by its own launcher (hccnrun or
torchrun: either gives the group's store at MASTER_ADDR:MASTER_PORT, which torchft's Manager
needs) and trains a full copy of the model. The groups average their gradients over
``hccn.torchft.ProcessGroupHccn`` (``HCCN_BACKEND=hccl``: over HCCL); kill one (``kill -9``) and
the others go on at the next quorum; start it again with the same command and it heals from a
live group's state (torchft's HTTP checkpoint transport) and joins. A frozen group (``kill
-STOP``) is an error to the others within hccn's detection time (~1 s), not after the process
group's timeout.

Everything here is torchft's documented API (Manager, DistributedDataParallel, Optimizer) with
two hccn pieces: the process group, and ``hccn.torchft.DistributedDataParallel``, torchft's own
with a gradient hook that survives a failed step (torchft 0.2.0's crashes the surviving group
when a step fails and the model has more than one gradient bucket; see examples/torchft/README.md).

Environment: ``REPLICA_GROUP_ID`` (0, 1, ...), ``TORCHFT_LIGHTHOUSE``, ``STEPS`` (default 100).
A group of more than one rank (``hccnrun -n 2``) runs one such replica per rank, each averaging
with the same rank of the other groups; sharding the model inside a group (HSDP) is torchft's
FSDP integration and not shown here. Each rank prints its progress and, at the end, a checksum
of its parameters: the groups that finished together print the same one.
"""

import os
import time
from datetime import timedelta

import torch
from torch import nn, optim

import torchft
from hccn.torchft import DistributedDataParallel, ProcessGroupHccn


def batch(step, replica, rank):
    """Each replica group (and rank) sees its own samples of the step."""
    g = torch.Generator().manual_seed(10_000 * step + 100 * replica + rank)
    x = torch.randn(64, 32, generator=g)
    return x, (x[:, :4].sum(dim=1) > 0).long()


def main():
    replica = int(os.environ.get("REPLICA_GROUP_ID", "0"))
    rank = int(os.environ.get("RANK", "0"))
    steps = int(os.environ.get("STEPS", "100"))

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 2))
    inner = optim.AdamW(model.parameters(), lr=1e-3)

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])

    def state_dict():
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    manager = torchft.Manager(
        pg=ProcessGroupHccn(timeout=timedelta(seconds=10)),
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"train_ddp_{replica}",
        timeout=timedelta(seconds=10),
    )
    ddp = DistributedDataParallel(manager, model)
    optimizer = torchft.Optimizer(manager, inner)
    loss_fn = nn.CrossEntropyLoss()

    while manager.current_step() < steps:
        optimizer.zero_grad()  # starts the quorum of this step
        step = manager.current_step()
        x, y = batch(step, replica, rank)
        loss = loss_fn(ddp(x), y)
        loss.backward()  # averages the gradients over the quorum's replica groups
        optimizer.step()  # only when every member of the step agrees it succeeded
        if manager.current_step() % 10 == 0 and manager.current_step() > step:
            print(
                f"replica group {replica} rank {rank}: step {manager.current_step()}, loss {loss.item():.4f}, "
                f"{manager.num_participants()} groups in the quorum",
                flush=True,
            )
        time.sleep(0.01)
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    print(f"replica group {replica} rank {rank}: done at step {manager.current_step()}, params {checksum!r}", flush=True)
    manager.shutdown(wait=False)


if __name__ == "__main__":
    main()
