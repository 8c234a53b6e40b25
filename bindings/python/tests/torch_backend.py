"""torch.distributed on the "hccn" backend: every operation, dtype and form it takes.

Run under torchrun (python -m torch.distributed.run) or under hccnrun, on 2 to 4 ranks; prints
"rank r of n: ok" when every check passed, else fails with the operation, dtype and rank. Values
are small integers (element j of rank r is a formula of r and j), exact in every dtype, so each
rank knows the exact result.
"""

import json
import os
import time

import torch
import torch.distributed as dist

import hccn
import hccn.torch

torch.set_num_threads(1)
dist.init_process_group("hccn")
r, n = dist.get_rank(), dist.get_world_size()
assert dist.get_backend() == "hccn"
tri = n * (n + 1) // 2
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.int8, torch.uint8]


def same(got, want, what):
    want = torch.as_tensor(want, dtype=got.dtype).expand_as(got) if not torch.is_tensor(want) else want
    assert torch.equal(got, want.to(got.dtype)), f"rank {r} of {n}: {what}: got {got.tolist()}, want {want.tolist()}"


def every_dtype():
    for dt in DTYPES:
        # all_reduce: every op; a rank's tensor is r+1 everywhere
        ops = [(dist.ReduceOp.SUM, tri), (dist.ReduceOp.MAX, n), (dist.ReduceOp.MIN, 1)]
        ops.append((dist.ReduceOp.PRODUCT, float(torch.arange(1, n + 1).prod())))
        if dt.is_floating_point:
            ops.append((dist.ReduceOp.AVG, tri / n))
        for op, want in ops:
            t = torch.full((5,), r + 1, dtype=dt)
            dist.all_reduce(t, op=op)
            same(t, want, f"all_reduce {op} {dt}")
        b = torch.arange(4, dtype=dt) + r
        dist.broadcast(b, src=n - 1)
        same(b, torch.arange(4) + n - 1, f"broadcast {dt}")
        x = torch.full((3,), r + 1, dtype=dt)
        dist.reduce(x, dst=0)
        same(x, tri if r == 0 else r + 1, f"reduce {dt}")
        flat = torch.zeros(n * 2, dtype=dt)
        dist.all_gather_into_tensor(flat, torch.full((2,), r, dtype=dt))
        same(flat, torch.arange(n).repeat_interleave(2), f"all_gather_into_tensor {dt}")
        outs = [torch.zeros(2, dtype=dt) for _ in range(n)]
        dist.all_gather(outs, torch.full((2,), r, dtype=dt))
        for i, o in enumerate(outs):
            same(o, i, f"all_gather {dt}")
        o = torch.zeros(2, dtype=dt)
        dist.reduce_scatter_tensor(o, torch.arange(2 * n, dtype=dt))
        same(o, torch.tensor([2 * r, 2 * r + 1]) * n, f"reduce_scatter_tensor {dt}")
        out = torch.zeros(n, dtype=dt)
        dist.all_to_all_single(out, torch.arange(n, dtype=dt) + 10 * r)
        same(out, torch.arange(n) * 10 + r, f"all_to_all_single {dt}")


def every_operation():
    # all_reduce on a non-contiguous tensor, and asynchronously with its future
    nc = torch.full((6, 4), float(r + 1)).t()
    assert not nc.is_contiguous()
    dist.all_reduce(nc)
    same(nc, tri, "all_reduce of a non-contiguous tensor")
    t = torch.full((1000,), float(r))
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    work.wait()
    assert work.is_completed()
    same(fut.wait()[0], sum(range(n)), "all_reduce future")
    chained = dist.all_reduce(torch.ones(3), async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    same(chained.wait(), 2 * n, "a future's then()")
    bools = torch.tensor([r == 0, False, True])
    dist.all_reduce(bools)  # a logical or
    same(bools, torch.tensor([True, False, True]), "all_reduce of bools")

    # gather, scatter, reduce_scatter (lists), all_to_all (lists, uneven)
    gl = [torch.zeros(2) for _ in range(n)] if r == 0 else None
    dist.gather(torch.full((2,), float(r)), gather_list=gl, dst=0)
    if r == 0:
        for i, g in enumerate(gl):
            same(g, i, "gather")
    sc = torch.zeros(2)
    dist.scatter(sc, scatter_list=[torch.full((2,), float(10 + i)) for i in range(n)] if r == 0 else None, src=0)
    same(sc, 10 + r, "scatter")
    o = torch.zeros(2)
    dist.reduce_scatter(o, [torch.full((2,), float(i + r)) for i in range(n)])
    same(o, n * r + sum(range(n)), "reduce_scatter")
    ao = [torch.zeros(i + 1) for i in range(n)]
    dist.all_to_all(ao, [torch.full((r + 1,), float(100 * r + j)) for j in range(n)])
    for i in range(n):
        same(ao[i], 100 * i + r, "all_to_all")
    send_splits = [j + 1 for j in range(n)]  # rank r sends j+1 rows to rank j
    recv_splits = [r + 1] * n  # so rank r receives r+1 rows from everyone
    inp = torch.cat([torch.full((j + 1, 2), float(10 * r + j)) for j in range(n)])
    out = torch.zeros(sum(recv_splits), 2)
    dist.all_to_all_single(out, inp, output_split_sizes=recv_splits, input_split_sizes=send_splits)
    same(out, torch.cat([torch.full((r + 1, 2), float(10 * i + r)) for i in range(n)]), "all_to_all_single uneven")
    dist.barrier()


def coalesced():
    # The forms DDP and FSDP use: one call for many tensors.
    ts = [torch.full((k + 1,), float(r + k)) for k in range(3)]
    dist.all_reduce_coalesced(ts)
    for k, t in enumerate(ts):
        same(t, sum(range(n)) + n * k, "all_reduce_coalesced")
    a, b = torch.full((3,), float(r)), torch.full((2,), float(2 * r))
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    same(a, sum(range(n)), "allreduce_coalesced (coalescing manager)")
    same(b, 2 * sum(range(n)), "allreduce_coalesced (coalescing manager)")
    outs = [torch.zeros(n * 2), torch.zeros(n * 3, dtype=torch.bfloat16)]
    ins = [torch.full((2,), float(r)), torch.full((3,), float(r), dtype=torch.bfloat16)]
    with dist._coalescing_manager():
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    same(outs[0], torch.arange(n).repeat_interleave(2), "allgather_into_tensor_coalesced")
    same(outs[1], torch.arange(n).repeat_interleave(3), "allgather_into_tensor_coalesced bf16")
    rs_out = [torch.zeros(1), torch.zeros(2, dtype=torch.float16)]
    rs_in = [torch.arange(n, dtype=torch.float32), torch.ones(2 * n, dtype=torch.float16)]
    with dist._coalescing_manager():
        for o, i in zip(rs_out, rs_in):
            dist.reduce_scatter_tensor(o, i)
    same(rs_out[0], n * r, "reduce_scatter_tensor_coalesced")
    same(rs_out[1], n, "reduce_scatter_tensor_coalesced fp16")


def point_to_point():
    if r == 0:
        dist.send(torch.tensor([42.0, 43.0]), dst=1)
    elif r == 1:
        got = torch.zeros(2)
        dist.recv(got, src=0)
        same(got, torch.tensor([42.0, 43.0]), "send/recv")
    # Tags are honoured: rank 0 sends tags 1, 2, 3; rank 1 receives them as 3, 1, 2.
    if r == 0:
        works = [dist.isend(torch.full((k,), float(k)), dst=1, tag=k) for k in (1, 2, 3)]
        for w in works:
            w.wait()
    elif r == 1:
        bufs = {k: torch.zeros(k) for k in (1, 2, 3)}
        works = [(k, dist.irecv(bufs[k], src=0, tag=k)) for k in (3, 1, 2)]
        for k, w in works:
            w.wait()
            same(bufs[k], k, f"recv with tag {k}")
    # A ring of isend/irecv, and batch_isend_irecv with the receive posted before the send.
    s = dist.isend(torch.full((3,), float(r)), dst=(r + 1) % n)
    got = torch.zeros(3)
    dist.irecv(got, src=(r - 1) % n).wait()
    s.wait()
    same(got, (r - 1) % n, "isend/irecv ring")
    ops = [
        dist.P2POp(dist.irecv, got[:1], (r - 1) % n),
        dist.P2POp(dist.isend, torch.full((1,), float(r)), (r + 1) % n),
    ]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    same(got[:1], (r - 1) % n, "batch_isend_irecv, receive first")
    # Non-contiguous receive buffer.
    col = torch.zeros(3, 2)[:, 1]
    dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((3,), float(r)), (r + 1) % n),
                            dist.P2POp(dist.irecv, col, (r - 1) % n)])[1].wait()
    same(col, (r - 1) % n, "irecv into a non-contiguous tensor")


def groups():
    members = list(range(0, n, 2)) if n > 2 else [0, 1]
    g = dist.new_group(members)
    if r in members:
        v = torch.tensor([float(r)])
        dist.all_reduce(v, group=g)
        same(v, sum(members), "all_reduce on new_group")
        assert dist.get_rank(g) == members.index(r)
        b = torch.tensor([float(r)])
        dist.broadcast(b, src=members[-1], group=g)  # a global rank, as torch takes it
        same(b, members[-1], "broadcast on new_group")
    everyone = dist.new_group(list(range(n)))
    v = torch.ones(1)
    dist.all_reduce(v, group=everyone)
    same(v, n, "all_reduce on a new_group of everyone")
    # split_group: the parent split into halves (ranks in the order given).
    halves = [list(range(0, n // 2)), list(range(n // 2, n))]
    sg = dist.split_group(split_ranks=halves)
    mine = halves[0] if r in halves[0] else halves[1]
    v = torch.tensor([float(r)])
    dist.all_reduce(v, group=sg)
    same(v, sum(mine), "all_reduce on split_group")
    assert dist.get_world_size(sg) == len(mine)
    if n > 2:  # a split that leaves the last rank out: it gets no group
        part = dist.split_group(split_ranks=[list(range(n - 1))])
        if r == n - 1:
            assert part is dist.GroupMember.NON_GROUP_MEMBER, part
        else:
            v = torch.ones(1)
            dist.all_reduce(v, group=part)
            same(v, n - 1, "all_reduce on a split_group without the last rank")


def flight_recorder():
    # torch attaches its FlightRecorderHook to every group of an out-of-tree backend (unless
    # TORCH_FR_BUFFER_SIZE=0). An operation that finished must read "completed" and retired in
    # its dump: an entry left "scheduled" is how a dump shows a collective that never finished,
    # and would blame this rank for a hang it had no part in. Everything above was waited for;
    # the stream's thread reports a queued operation's completion just after waking its waiter,
    # hence the short retry.
    if os.environ.get("TORCH_FR_BUFFER_SIZE", os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE")) == "0":
        return
    deadline = time.monotonic() + 10
    while True:
        entries = json.loads(torch._C._distributed_c10d._dump_fr_trace_json(backend="hccn")).get("entries", [])
        open_ = [(e.get("profiling_name"), e.get("state"), e.get("retired")) for e in entries
                 if e.get("state") != "completed" or not e.get("retired")]
        if entries and not open_ or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert entries, f"rank {r}: the flight recorder holds no hccn entry"
    assert not open_, f"rank {r}: {len(open_)} of {len(entries)} entries not completed: {open_[:5]}"


def errors():
    # Refused arguments: hccn's InvalidArgumentError, which is also torch's DistBackendError, with
    # the code and a message that says what is wrong; the group keeps working.
    cases = [
        ("a bitwise reduce op", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.BAND),
         "reduce op"),
        ("an uneven all_to_all_single", lambda: dist.all_to_all_single(torch.zeros(n + 1), torch.zeros(n + 1)),
         "multiple of the group size"),
        ("a short all_gather output", lambda: dist.all_gather_into_tensor(torch.zeros(1), torch.zeros(1)),
         "elements"),
    ]
    for what, call, needle in cases:
        try:
            call()
        except hccn.InvalidArgumentError as e:
            assert isinstance(e, dist.DistBackendError), type(e).__mro__
            assert e.code == hccn.Result.ERROR_INVALID_ARGUMENT, e.code
            assert needle in str(e), f"{what}: {e}"
        else:
            raise AssertionError(f"rank {r}: {what} was accepted")
    dist.barrier()


every_dtype()
every_operation()
coalesced()
if n > 1:
    point_to_point()
groups()
flight_recorder()
errors()
dist.destroy_process_group()
print(f"rank {r} of {n}: ok", flush=True)
