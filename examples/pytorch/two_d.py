"""2-D parallelism on 4 ranks: data parallel × tensor parallel (2 × 2) with new_group.

Ranks {0,1} and {2,3} are tensor-parallel groups, each holding one copy of a Megatron-style MLP
block split over its two ranks (A by columns, B by rows; an all_reduce in the tensor group in
each pass). Ranks {0,2} and {1,3} are data-parallel groups: the two copies see different halves
of the global batch, and each shard's gradients are averaged over its data group. Every rank also
trains the unsplit block on the whole batch in one process; the run fails unless the rebuilt
parameters match within 1e-5.

    hccnrun -n 4 /opt/hccn/venvs/torch/bin/python examples/pytorch/two_d.py
"""

import torch
import torch.distributed as dist
import torch.nn as nn

import hccn.torch  # noqa: F401 - registers the "hccn" backend

STEPS, PER_COPY, D, H, TOL, LR, TP = 8, 8, 16, 32, 1e-5, 0.05, 2

torch.set_num_threads(1)
dist.init_process_group("hccn")
rank, world = dist.get_rank(), dist.get_world_size()
assert world % TP == 0
DP = world // TP
tp_rank, dp_rank = rank % TP, rank // TP
# Every rank creates every group, in the same order (torch.distributed's rule).
tp_groups = [dist.new_group([d * TP + t for t in range(TP)]) for d in range(DP)]
dp_groups = [dist.new_group([d * TP + t for d in range(DP)]) for t in range(TP)]
tp_group, dp_group = tp_groups[dp_rank], dp_groups[tp_rank]


class CopyToParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=tp_group)
        return grad


class ReduceFromParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        dist.all_reduce(x, group=tp_group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


torch.manual_seed(0)
a0, b0 = torch.randn(D, H) / D**0.5, torch.randn(H, D) / H**0.5
cols = H // TP
a = nn.Parameter(a0[:, tp_rank * cols : (tp_rank + 1) * cols].clone())
b = nn.Parameter(b0[tp_rank * cols : (tp_rank + 1) * cols, :].clone())
opt = torch.optim.SGD([a, b], lr=LR)
fa, fb = nn.Parameter(a0.clone()), nn.Parameter(b0.clone())
ref_opt = torch.optim.SGD([fa, fb], lr=LR)

data = torch.Generator().manual_seed(5)
for step in range(STEPS):
    x = torch.randn(PER_COPY * DP, D, generator=data)
    target = torch.randn(PER_COPY * DP, D, generator=data)
    mine = slice(dp_rank * PER_COPY, (dp_rank + 1) * PER_COPY)

    opt.zero_grad()
    y = ReduceFromParallel.apply(nn.functional.gelu(CopyToParallel.apply(x[mine]) @ a) @ b)
    loss = nn.functional.mse_loss(y, target[mine])
    loss.backward()
    for p in (a, b):  # data parallel: average this shard's gradient over the copies
        dist.all_reduce(p.grad, op=dist.ReduceOp.AVG, group=dp_group)
    opt.step()

    ref_opt.zero_grad()
    ref_loss = nn.functional.mse_loss(nn.functional.gelu(x @ fa) @ fb, target)
    ref_loss.backward()
    ref_opt.step()
    loss = loss.detach()
    dist.all_reduce(loss, op=dist.ReduceOp.AVG, group=dp_group)
    if rank == 0:
        print(f"step {step}: loss {loss.item():.6f} (single process {ref_loss.item():.6f})", flush=True)

a_parts = [torch.empty_like(a) for _ in range(TP)]
b_parts = [torch.empty_like(b) for _ in range(TP)]
dist.all_gather(a_parts, a.detach().contiguous(), group=tp_group)
dist.all_gather(b_parts, b.detach().contiguous(), group=tp_group)
diff = max((torch.cat(a_parts, 1) - fa).abs().max().item(), (torch.cat(b_parts, 0) - fb).abs().max().item())
print(f"rank {rank} (data {dp_rank}, tensor {tp_rank}): max parameter difference {diff:.2e} (tolerance {TOL:g})", flush=True)
assert diff <= TOL, "2-D training diverged from the single-process run"
dist.barrier()
if rank == 0:
    print("two_d: MATCH")
dist.destroy_process_group()
