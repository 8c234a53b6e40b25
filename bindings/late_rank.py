"""For the bindings' timeout tests: a rank that never enters a collective, and the others.

The ranks meet and pass rank 0's verdict through files in a directory they share, outside the
framework, whose own joining the short timeout under test would bound (and a rank still
importing its framework must not count as one that never comes). The tests put this directory
(bindings/) on sys.path.
"""

import os
import sys
import time


def wait_for(path, rank, limit=120.0):
    end = time.monotonic() + limit
    while not os.path.exists(path):
        if time.monotonic() > end:
            sys.exit(f"rank {rank}: {path} never appeared")
        time.sleep(0.02)


def meet(shared, rank, n):
    """Returns once all n ranks have called it."""
    open(os.path.join(shared, f"ready-{rank}"), "w").close()
    for r in range(n):
        wait_for(os.path.join(shared, f"ready-{r}"), rank)


def verdict(shared, rank, mine=None):
    """Rank 0 passes its verdict (a string); every rank returns it once it is there."""
    path = os.path.join(shared, "verdict")
    if mine is not None:
        with open(path + ".tmp", "w") as f:
            f.write(mine)
        os.rename(path + ".tmp", path)
    wait_for(path, rank)
    with open(path) as f:
        return f.read()
