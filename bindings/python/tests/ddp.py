"""DDP training of a small CNN on synthetic data, on the backend named in argv[1] ("hccn" or
"gloo"); rank 0 writes the final parameters to argv[2] as raw float64 values. Run under
torchrun or hccnrun with the same world size for both backends and compare the files.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hccn.torch  # noqa: F401 - registers "hccn"

backend, out = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 8
torch.set_num_threads(1)
dist.init_process_group(backend)
r, n = dist.get_rank(), dist.get_world_size()

torch.manual_seed(0)
model = nn.Sequential(
    nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
    nn.Flatten(), nn.Linear(32, 10),
)
# Rank-dependent start: DDP must broadcast rank 0's parameters for the runs to agree.
with torch.no_grad():
    for p in model.parameters():
        p.add_(0.01 * r)
ddp = DDP(model, bucket_cap_mb=0.001)  # tiny buckets: several allreduces per step
opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
gen = torch.Generator().manual_seed(1234)
per_rank = 8
for step in range(steps):
    x = torch.randn(per_rank * n, 1, 12, 12, generator=gen)
    y = torch.randint(0, 10, (per_rank * n,), generator=gen)
    xs, ys = x[r * per_rank : (r + 1) * per_rank], y[r * per_rank : (r + 1) * per_rank]
    opt.zero_grad()
    loss = nn.functional.cross_entropy(ddp(xs), ys)
    loss.backward()
    opt.step()
    if r == 0:
        print(f"{backend} step {step} loss {loss.item():.6f}", flush=True)
if r == 0:  # every parameter and buffer, as float64 in state_dict order
    torch.cat([v.detach().reshape(-1).double() for v in model.state_dict().values()]).numpy().tofile(out)
dist.destroy_process_group()
