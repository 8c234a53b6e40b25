"""A lost rank on the "hccn" backend: the errors the survivors see, torch's shrink_group over
hccn's agreement, and hccn.torch.rebuild admitting the replacement.

    hccnrun --elastic --max-restarts 1 -n 3 python torch_failure.py

The process launched as the last rank kills itself (SIGKILL) after one good all_reduce. The
survivors check that a blocking all_reduce raises hccn.RankFailedError, which is a torch
DistBackendError naming the lost rank, and that an asynchronous one fails the same way (when it
is issued or when it is waited for); then they shrink the default group with
torch.distributed.shrink_group, reduce on it, and rebuild it with hccn.torch.rebuild, which admits
the replacement that hccnrun started. Everyone ends with one all_reduce on the full group and
prints "rank r of n: ok" (the replacement: "replacement rank r of n: ok").
"""

import os
import signal

import torch
import torch.distributed as dist

import hccn
import hccn.torch


def expect_rank_failed(call, lost, what):
    try:
        call()
    except hccn.RankFailedError as e:
        assert isinstance(e, dist.DistBackendError), f"{what}: {type(e).__mro__}"
        assert e.code == hccn.Result.ERROR_RANK_FAILED, f"{what}: code {e.code}"
        assert tuple(e.failed_ranks) == (lost,), f"{what}: failed ranks {e.failed_ranks}, want ({lost},)"
        assert f"failed ranks: {lost}" in str(e), f"{what}: {e}"
        return
    raise AssertionError(f"{what}: no error after rank {lost} was killed")


def survivor(n):
    lost = n - 1
    t = torch.ones(4)
    expect_rank_failed(lambda: dist.all_reduce(t), lost, "blocking all_reduce")
    assert hccn.torch.failed_ranks() == [lost], hccn.torch.failed_ranks()

    def async_all_reduce():
        work = dist.all_reduce(torch.ones(4), async_op=True)
        work.get_future().wait()

    expect_rank_failed(async_all_reduce, lost, "asynchronous all_reduce")

    # torch's own API: the backend runs hccn's agreement, which must find exactly [lost].
    small = dist.shrink_group([lost])
    assert dist.get_world_size() == n - 1 and dist.get_backend() == "hccn"
    v = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(v, group=small)
    assert v.item() == (n - 1) * n / 2, v
    # A sub-group of the shrunk default group comes from its communicator.
    sub = dist.new_group(list(range(n - 1)))
    v = torch.ones(1)
    dist.all_reduce(v, group=sub)
    assert v.item() == n - 1, v

    # Grow back: admit the replacement hccnrun started (waiting up to a minute for it).
    hccn.torch.rebuild(timeout=60)
    assert dist.get_world_size() == n, dist.get_world_size()


def main():
    dist.init_process_group("hccn")
    n = int(os.environ["HCCN_WORLD_SIZE"])
    replacement = hccn.torch.is_replacement()
    if not replacement:
        t = torch.ones(4)
        dist.all_reduce(t)
        assert (t == n).all()
        if int(os.environ["HCCN_RANK"]) == n - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        survivor(n)
    t = torch.full((4,), float(dist.get_rank()))
    dist.all_reduce(t)
    assert (t == n * (n - 1) / 2).all(), t
    who = "replacement rank" if replacement else "rank"
    print(f"{who} {dist.get_rank()} of {dist.get_world_size()}: ok", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
