"""torch.distributed (gloo) allreduce sweep for benches/compare.sh: fp32 sum, in place, sizes
min..max by a factor, each size checked once, then timed like allreduce_mpi.c (iterations for
~0.15 s agreed by all ranks, median of 3 repetitions, the slowest rank). Rank 0 prints
"bytes microseconds". Usage: python allreduce_gloo.py NRANKS [min max factor]"""
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, n, sizes, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=n)
    want = n * (n + 1) / 2
    for nbytes in sizes:
        t = torch.full((nbytes // 4,), float(rank + 1), dtype=torch.float32)
        dist.all_reduce(t)
        if t[0].item() != want or t[-1].item() != want:
            sys.exit(f"allreduce_gloo: wrong result at {nbytes} bytes")
        t0 = time.perf_counter()
        dist.all_reduce(t)
        once = time.perf_counter() - t0
        iters = torch.tensor([max(1, min(10000, int(0.15 / once) if once > 0 else 10000))])
        dist.all_reduce(iters, op=dist.ReduceOp.MAX)
        reps = []
        for _ in range(3):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(int(iters.item())):
                dist.all_reduce(t)
            mine = torch.tensor([(time.perf_counter() - t0) / int(iters.item())], dtype=torch.float64)
            dist.all_reduce(mine, op=dist.ReduceOp.MAX)
            reps.append(mine.item())
        if rank == 0:
            print(f"{nbytes} {sorted(reps)[1] * 1e6:.3f}", flush=True)
    dist.destroy_process_group()


def main():
    n = int(sys.argv[1])
    lo, hi, f = (int(x) for x in sys.argv[2:5]) if len(sys.argv) > 4 else (4, 256 << 20, 4)
    sizes = []
    s = lo
    while s <= hi:
        sizes.append(s)
        s *= f
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(worker, args=(n, sizes, port), nprocs=n, join=True)


if __name__ == "__main__":
    main()
