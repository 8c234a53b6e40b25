"""hccn.init(rank=, world_size=, store=) without hccnrun: the unique id travels through a
FileStore directory and through a torch TCPStore.

    python init_store.py N DIR     # starts N ranks of each kind itself, kills them after 60 s
"""

import os
import subprocess
import sys

import numpy as np


def child(kind, rank, n, where):
    import hccn

    if kind == "file":
        store = where  # a directory path is a FileStore
    else:
        import torch.distributed as dist

        store = dist.TCPStore("127.0.0.1", int(where), n, rank == 0, wait_for_workers=False)
    g = hccn.init(rank=rank, world_size=n, store=store)
    assert (g.rank, g.size) == (rank, n)
    x = np.full(10, rank + 1, dtype=np.float32)
    hccn.allreduce(x)
    assert (x == n * (n + 1) / 2).all(), x
    hccn.finalize()
    print(f"{kind} rank {rank} of {n}: ok", flush=True)


def spawn(n, directory):
    import socket

    with socket.socket() as s:  # a free port for the TCPStore that rank 0 hosts
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kinds = [("file", directory), ("tcp", str(port))]
    try:
        import torch.distributed  # noqa: F401 - the TCPStore kind needs torch
    except ImportError:
        print("torch is not installed: the file store only", flush=True)
        kinds = kinds[:1]
    for kind, where in kinds:
        procs = [
            subprocess.Popen([sys.executable, __file__, "child", kind, str(r), str(n), where]) for r in range(n)
        ]
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=60))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                codes.append("timeout")
        if codes != [0] * n:
            sys.exit(f"{kind}: ranks ended with {codes}")


if __name__ == "__main__":
    if sys.argv[1] == "child":
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    else:
        os.makedirs(sys.argv[2], exist_ok=True)
        spawn(int(sys.argv[1]), sys.argv[2])
