"""torch.distributed's "hccn" backend as a user of the installed wheel gets it: 2 ranks under
torchrun or hccnrun, all_reduce and broadcast, and where the package and the backend come from.

Prints "rank r of n: ok (hccn PATH, backend PATH)" when every value is right.
"""

import torch
import torch.distributed as dist

import hccn
import hccn.torch

dist.init_process_group("hccn")
r, n = dist.get_rank(), dist.get_world_size()
assert dist.get_backend() == "hccn", dist.get_backend()
t = torch.full((1000,), float(r + 1))
dist.all_reduce(t)
assert torch.equal(t, torch.full((1000,), n * (n + 1) / 2)), t[:4]
b = torch.arange(8, dtype=torch.int64) * (r + 1)
dist.broadcast(b, src=n - 1)
assert torch.equal(b, torch.arange(8, dtype=torch.int64) * n), b
dist.destroy_process_group()
print(f"rank {r} of {n}: ok (hccn {hccn.__file__}, backend {hccn.torch._C.__file__})", flush=True)
