"""Tensor parallel: a Megatron-style MLP block, Y = GeLU(X A) B, split over the ranks.

A is split by columns and B by rows, so each rank computes GeLU(X A_i) B_i with no communication
in between; one all_reduce sums the partial outputs in the forward pass (g), and one all_reduce
sums the partial input gradients in the backward pass (f), as in Megatron-LM. Every rank also
trains the unsplit block in one process; the run fails unless the outputs and, after training,
the rebuilt A and B match it within 1e-5.

    hccnrun -n 2 /opt/hccn/venvs/torch/bin/python examples/pytorch/tensor_parallel.py
"""

import torch
import torch.distributed as dist
import torch.nn as nn

import hccn.torch  # noqa: F401 - registers the "hccn" backend

STEPS, BATCH, D, H, TOL, LR = 8, 16, 32, 64, 1e-5, 0.05

torch.set_num_threads(1)
dist.init_process_group("hccn")
rank, world = dist.get_rank(), dist.get_world_size()


class CopyToParallel(torch.autograd.Function):
    """f: identity forward; all_reduce of the input gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad


class ReduceFromParallel(torch.autograd.Function):
    """g: all_reduce of the partial outputs forward; identity backward."""

    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class ParallelMLP(nn.Module):
    def __init__(self, a, b):
        super().__init__()
        cols = H // world
        self.a = nn.Parameter(a[:, rank * cols : (rank + 1) * cols].clone())  # column-parallel
        self.b = nn.Parameter(b[rank * cols : (rank + 1) * cols, :].clone())  # row-parallel

    def forward(self, x):
        x = CopyToParallel.apply(x)
        return ReduceFromParallel.apply(nn.functional.gelu(x @ self.a) @ self.b)


class MLP(nn.Module):
    def __init__(self, a, b):
        super().__init__()
        self.a, self.b = nn.Parameter(a.clone()), nn.Parameter(b.clone())

    def forward(self, x):
        return nn.functional.gelu(x @ self.a) @ self.b


torch.manual_seed(0)
a0, b0 = torch.randn(D, H) / D**0.5, torch.randn(H, D) / H**0.5
par, full = ParallelMLP(a0, b0), MLP(a0, b0)
opt = torch.optim.SGD(par.parameters(), lr=LR)
ref_opt = torch.optim.SGD(full.parameters(), lr=LR)
data = torch.Generator().manual_seed(3)
for step in range(STEPS):
    x = torch.randn(BATCH, D, generator=data, requires_grad=True)  # every rank sees the same batch
    target = torch.randn(BATCH, D, generator=data)
    x_ref = x.detach().clone().requires_grad_()

    opt.zero_grad()
    y = par(x)
    loss = nn.functional.mse_loss(y, target)
    loss.backward()
    opt.step()

    ref_opt.zero_grad()
    y_ref = full(x_ref)
    ref_loss = nn.functional.mse_loss(y_ref, target)
    ref_loss.backward()
    ref_opt.step()

    out_diff = (y - y_ref).abs().max().item()
    in_grad_diff = (x.grad - x_ref.grad).abs().max().item()
    assert out_diff <= TOL and in_grad_diff <= TOL, (out_diff, in_grad_diff)
    if rank == 0:
        print(f"step {step}: loss {loss.item():.6f} (unsplit {ref_loss.item():.6f}), "
              f"output diff {out_diff:.1e}, input-gradient diff {in_grad_diff:.1e}", flush=True)

# Rebuild A and B from the shards and compare them with the unsplit block's.
a_parts = [torch.empty_like(par.a) for _ in range(world)]
b_parts = [torch.empty_like(par.b) for _ in range(world)]
dist.all_gather(a_parts, par.a.detach().contiguous())
dist.all_gather(b_parts, par.b.detach().contiguous())
diff = max((torch.cat(a_parts, 1) - full.a).abs().max().item(), (torch.cat(b_parts, 0) - full.b).abs().max().item())
if rank == 0:
    print(f"max parameter difference from the unsplit block: {diff:.2e} (tolerance {TOL:g})")
assert diff <= TOL, "tensor-parallel training diverged from the unsplit block"
if rank == 0:
    print("tensor_parallel: MATCH")
dist.destroy_process_group()
