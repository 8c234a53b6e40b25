"""ZeRO stage 1 and 2: Adam's state (stage 1) and the gradients too (stage 2) are sharded over the
ranks with reduce_scatter and all_gather on the hccn backend.

Each rank owns 1/world of the flattened parameters: it keeps Adam's moments only for that shard
and updates only that shard, then all_gather rebuilds the full parameters. Stage 1 allreduces the
full gradient and keeps its shard; stage 2 reduce_scatters it, so a rank never holds more than its
shard of the averaged gradient. Every rank also trains the unsplit model with torch.optim.Adam on
the whole global batch in one process; the run fails unless both stages match it within 1e-5.

    hccnrun -n 2 /opt/hccn/venvs/torch/bin/python examples/pytorch/zero.py
"""

import copy

import torch
import torch.distributed as dist
import torch.nn as nn

import hccn.torch  # noqa: F401 - registers the "hccn" backend

STEPS, PER_RANK, TOL, LR = 8, 6, 1e-5, 0.01

torch.set_num_threads(1)
dist.init_process_group("hccn")
rank, world = dist.get_rank(), dist.get_world_size()


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 5))


def batches():
    gen = torch.Generator().manual_seed(7)
    for _ in range(STEPS):
        yield torch.randn(PER_RANK * world, 20, generator=gen), torch.randn(PER_RANK * world, 5, generator=gen)


def flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def unflatten_into(vec, tensors):
    off = 0
    for t in tensors:
        t.copy_(vec[off : off + t.numel()].view_as(t))
        off += t.numel()


def train_zero(stage):
    model = make_model()
    params = list(model.parameters())
    numel = sum(p.numel() for p in params)
    padded = -(-numel // world) * world  # a multiple of the world size
    shard_len = padded // world
    lo = rank * shard_len
    full = torch.zeros(padded)
    full[:numel] = flat(p.detach() for p in params)
    shard = nn.Parameter(full[lo : lo + shard_len].clone())  # the parameters this rank updates
    opt = torch.optim.Adam([shard], lr=LR)  # Adam's moments exist for this shard only
    for step, (x, y) in enumerate(batches()):
        mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
        model.zero_grad()
        loss = nn.functional.mse_loss(model(x[mine]), y[mine])
        loss.backward()
        grad = torch.zeros(padded)
        grad[:numel] = flat(p.grad for p in params)
        if stage == 1:  # the whole averaged gradient, then keep this rank's shard
            dist.all_reduce(grad, op=dist.ReduceOp.AVG)
            shard.grad = grad[lo : lo + shard_len].clone()
        else:  # stage 2: only this rank's shard of the averaged gradient ever arrives
            shard.grad = torch.empty(shard_len)
            dist.reduce_scatter_tensor(shard.grad, grad, op=dist.ReduceOp.AVG)
        opt.step()
        dist.all_gather_into_tensor(full, shard.detach())
        with torch.no_grad():
            unflatten_into(full[:numel], params)
        loss = loss.detach()
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        if rank == 0:
            print(f"stage {stage} step {step}: loss {loss.item():.6f}", flush=True)
    state_bytes = sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
    grad_bytes = shard_len * 4 if stage == 2 else numel * 4
    return model, state_bytes, grad_bytes, numel


def train_single():
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    for x, y in batches():
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model


reference = train_single()
for stage in (1, 2):
    model, state_bytes, grad_bytes, numel = train_zero(stage)
    diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), reference.parameters()))
    plain_state = 2 * numel * 4 + 4  # plain data parallel: both moments of every parameter (+ step)
    if rank == 0:
        print(
            f"stage {stage}: Adam state {state_bytes} B per rank (plain data parallel: {plain_state} B), "
            f"averaged gradient kept {grad_bytes} B (plain: {numel * 4} B); "
            f"max parameter difference from single-process Adam {diff:.2e} (tolerance {TOL:g})",
            flush=True,
        )
    assert diff <= TOL, f"ZeRO stage {stage} diverged from single-process Adam"
if rank == 0:
    print("zero: MATCH")
dist.destroy_process_group()
