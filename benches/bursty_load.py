"""Bursty load for measuring waits under other work: each process spins and sleeps 0.1-3 ms at
random, as compilers, data loaders and other jobs load a shared machine (steady busy loops do not
show the slow mode of small collectives, whose trigger is wake-ups, not a full run queue).

    python3 benches/bursty_load.py SECONDS [PROCESSES]      (default: 4 processes)

Used for the "waits follow what they meet" figures of bindings/python/csrc/README.md:

    python3 benches/bursty_load.py 120 4 &
    HCCN_LIB=target/release/libhccn.so /opt/hccn/venvs/torch/bin/python -m torch.distributed.run \\
        --standalone --nproc-per-node 2 benches/small_allreduce_torch.py --backend hccn

Nothing here is a test.
"""

import multiprocessing
import random
import sys
import time


def burst(seconds):
    end = time.time() + seconds
    while time.time() < end:
        until = time.perf_counter() + random.uniform(0.0001, 0.003)
        while time.perf_counter() < until:
            pass
        time.sleep(random.uniform(0.0001, 0.003))


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    processes = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    workers = [multiprocessing.Process(target=burst, args=(seconds,)) for _ in range(processes)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


if __name__ == "__main__":
    main()
