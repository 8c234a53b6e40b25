"""Data parallel: a small CNN trained with PyTorch DDP on the hccn backend.

Every rank trains on its slice of the same global batch; rank 0 also trains an identical model
alone on the whole global batch, and the run fails unless the parameters agree within 1e-5.

    hccnrun -n 2 /opt/hccn/venvs/torch/bin/python examples/pytorch/ddp_cnn.py
"""

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hccn.torch  # noqa: F401 - registers the "hccn" backend

STEPS, PER_RANK, TOL = 10, 8, 1e-5

torch.set_num_threads(1)
dist.init_process_group("hccn")
rank, world = dist.get_rank(), dist.get_world_size()

torch.manual_seed(0)
model = nn.Sequential(
    nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
    nn.Flatten(), nn.Linear(64, 10),
)
reference = copy.deepcopy(model)  # the single-process run (rank 0 checks against it)
ddp = DDP(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)

data = torch.Generator().manual_seed(42)  # the same synthetic images on every rank
for step in range(STEPS):
    images = torch.randn(PER_RANK * world, 3, 16, 16, generator=data)
    labels = torch.randint(0, 10, (PER_RANK * world,), generator=data)
    mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)

    opt.zero_grad()
    loss = nn.functional.cross_entropy(ddp(images[mine]), labels[mine])
    loss.backward()  # DDP averages the gradients over the ranks through hccn
    opt.step()

    global_loss = loss.detach().clone()
    dist.all_reduce(global_loss, op=dist.ReduceOp.AVG)
    if rank == 0:
        ref_opt.zero_grad()
        ref_loss = nn.functional.cross_entropy(reference(images), labels)
        ref_loss.backward()
        ref_opt.step()
        print(f"step {step}: loss {global_loss.item():.6f} (single process {ref_loss.item():.6f})", flush=True)

if rank == 0:
    diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), reference.parameters()))
    print(f"max parameter difference from the single-process run: {diff:.2e} (tolerance {TOL:g})")
    assert diff <= TOL, "data parallel training diverged from the single-process run"
    print("ddp_cnn: MATCH")
dist.destroy_process_group()
