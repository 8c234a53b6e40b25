"""hccn from Python under whatever launched it: the same script under

    srun -n 4 python allreduce.py
    mpirun -n 4 python allreduce.py
    torchrun --nproc-per-node 4 --no-python python allreduce.py
    hccnrun -n 4 python allreduce.py

hccn.init() reads the launcher's variables (docs/launchers.md); every rank checks the sum.
"""

import numpy as np

import hccn

world = hccn.init()
rank, size = world.rank, world.size
x = np.arange(1024, dtype=np.float64) + 1000.0 * rank
hccn.allreduce(x)
want = np.arange(1024, dtype=np.float64) * size + 1000.0 * size * (size - 1) / 2
if not np.array_equal(x, want):
    raise SystemExit(f"rank {rank} of {size}: WRONG sum, first elements {x[:4]} want {want[:4]}")
hccn.barrier()
print(f"rank {rank} of {size}: ok", flush=True)
hccn.finalize()
