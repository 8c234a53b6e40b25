"""Elastic DDP training on hccn: a rank is killed, the others go on at once, and a replacement
joins later with the model and optimizer state it receives from a survivor over hccn.

    hccnrun --elastic -n 3 /opt/hccn/venvs/torch/bin/python examples/pytorch/elastic_ddp.py
    ELASTIC_KILL=1:12 hccnrun --elastic -n 3 .../python examples/pytorch/elastic_ddp.py

ELASTIC_KILL=RANK:STEP[,RANK:STEP...] makes the process launched as RANK kill itself (SIGKILL)
at STEP, between its forward and backward passes. What happens then:

1. The survivors' DDP backward fails with hccn's RankFailedError (a DistBackendError).
2. They call hccn.torch.shrink(): hccn agrees in band on who is left and torch's default group is
   made again over the survivors (no store needed; the store host may be the one that died).
3. Everyone takes rank 0's step, model and optimizer state (broadcast over hccn), DDP is wrapped
   again on the new group, and the interrupted step is done again: within one step.
4. hccnrun has started a replacement meanwhile (a new Python process: importing torch takes
   seconds). Every POLL steps, while fewer than the launched ranks are alive, the survivors call
   hccn.torch.rebuild(timeout=0), which admits whoever is waiting to join and costs about a
   millisecond when nobody is. If ranks are still missing when two thirds of the steps are done,
   the survivors wait for them there (rebuild(timeout=60)), so that a replacement always trains
   the last third. The replacement (hccn.torch.is_replacement()) receives the step, model and
   optimizer state over hccn as in 3 (no checkpoint file) and trains with the others.

Re-sharding: step s trains on one global batch of BATCH samples that depends on s only (sample i
of step s is drawn from a generator seeded with s). The ranks alive at that step split it into
contiguous shards by their current rank and size (sizes differ by at most one sample). Each rank's
loss is the sum of its samples' losses times world_size / BATCH, so that DDP's average over the
ranks is the mean over the whole batch, whatever the number of ranks. The model therefore
follows the same trajectory as one process training on the whole batches, up to floating-point
summation order: at the end, rank 0 trains that uninterrupted run itself and fails unless every
parameter agrees within 1e-5 (prints "elastic_ddp: MATCH").
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hccn.torch

STEPS = int(os.environ.get("ELASTIC_STEPS", "40"))
BATCH = 48
POLL = 2  # steps between admissions of replacements, while ranks are missing
IN, HIDDEN = 16, 32


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def global_batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, IN, generator=g, dtype=torch.float64).float()
    y = torch.sin(x.sum(dim=1, keepdim=True))
    return x, y


def shard(step, rank, size):
    """This rank's contiguous part of step's global batch."""
    x, y = global_batch(step)
    lo, hi = rank * BATCH // size, (rank + 1) * BATCH // size
    return x[lo:hi], y[lo:hi]


def kill_plan():
    plan = {}
    for item in filter(None, os.environ.get("ELASTIC_KILL", "").split(",")):
        rank, step = item.split(":")
        plan[int(rank)] = int(step)
    return plan


def reference():
    """The uninterrupted run: one process, whole batches."""
    model = make_model()
    opt = make_optimizer(model)
    for step in range(STEPS):
        x, y = global_batch(step)
        opt.zero_grad()
        (((model(x) - y) ** 2).sum() / BATCH).backward()
        opt.step()
    return model


def sync_state(model, opt, step):
    """Everyone takes rank 0's step, model and optimizer state (after any membership change)."""
    payload = [step, model.state_dict(), opt.state_dict()] if dist.get_rank() == 0 else [None, None, None]
    dist.broadcast_object_list(payload, src=0)
    step, params, opt_state = payload
    model.load_state_dict(params)
    opt.load_state_dict(opt_state)
    return step


def main():
    dist.init_process_group("hccn")
    launched_rank, target = int(os.environ["HCCN_RANK"]), int(os.environ["HCCN_WORLD_SIZE"])
    dies_at = None if hccn.torch.is_replacement() else kill_plan().get(launched_rank)
    model = make_model()
    opt = make_optimizer(model)
    step, need_sync, failed_at = 0, hccn.torch.is_replacement(), None
    ddp = None

    while True:
        if need_sync:
            step = sync_state(model, opt, step)
            ddp = None
            need_sync = False
        if step >= STEPS:
            break
        if ddp is None:
            ddp = DDP(model)  # broadcasts rank 0's parameters too
        rank, size = dist.get_rank(), dist.get_world_size()
        x, y = shard(step, rank, size)
        try:
            opt.zero_grad()
            loss = ((ddp(x) - y) ** 2).sum() * size / BATCH
            if step == dies_at:
                print(f"rank {rank}: killing itself at step {step} at t={time.time():.3f}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            loss.backward()
            opt.step()
        except dist.DistBackendError as e:
            # The group lost a member: go on with the survivors, redo this step.
            failed_at = failed_at or time.time()
            print(f"rank {rank}: step {step} failed ({type(e).__name__}); shrinking", flush=True)
            hccn.torch.shrink()
            need_sync = True
            continue
        if failed_at is not None:
            print(
                f"rank {dist.get_rank()} of {dist.get_world_size()}: first good step after the failure "
                f"(step {step}) at t={time.time():.3f}, {time.time() - failed_at:.3f} s after it was seen",
                flush=True,
            )
            failed_at = None
        if dist.get_rank() == 0 and step % 5 == 0:
            print(f"step {step} loss {loss.item():.6f} ranks {size}", flush=True)
        step += 1
        if dist.get_world_size() < target and (step % POLL == 0 or step == 2 * STEPS // 3):
            before = dist.get_world_size()
            hccn.torch.rebuild(timeout=60 if step >= 2 * STEPS // 3 else 0)
            if dist.get_world_size() != before:
                print(f"rank {dist.get_rank()}: {dist.get_world_size()} ranks after admitting a replacement", flush=True)
                need_sync = True

    if dist.get_rank() == 0:
        want = reference()
        worst = max((a - b).abs().max().item() for a, b in zip(model.parameters(), want.parameters()))
        print(f"elastic_ddp: max parameter difference from the uninterrupted run {worst:.2e}", flush=True)
        if worst > 1e-5:
            print("elastic_ddp: MISMATCH", flush=True)
            sys.exit(1)
        print("elastic_ddp: MATCH", flush=True)
    print(f"rank {dist.get_rank()} of {dist.get_world_size()}: done (replacement: {hccn.torch.is_replacement()})",
          flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
