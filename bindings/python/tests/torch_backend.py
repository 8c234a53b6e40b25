"""torch.distributed on the "hccn" backend: every collective, async work, send/recv, new_group.

Run under torchrun (python -m torch.distributed.run) or under hccnrun, on any number of ranks;
prints "rank r of n: ok" when every check passed.
"""

import torch
import torch.distributed as dist

import hccn.torch  # noqa: F401 - registers the backend

torch.set_num_threads(1)
dist.init_process_group("hccn")
r, n = dist.get_rank(), dist.get_world_size()
assert dist.get_backend() == "hccn"
tri = n * (n + 1) // 2

# all_reduce: every op, a non-contiguous tensor, async with a future
for op, want in [
    (dist.ReduceOp.SUM, tri),
    (dist.ReduceOp.PRODUCT, float(torch.arange(1, n + 1).prod())),
    (dist.ReduceOp.MAX, n),
    (dist.ReduceOp.MIN, 1),
    (dist.ReduceOp.AVG, tri / n),
]:
    t = torch.full((4, 5), float(r + 1))
    dist.all_reduce(t, op=op)
    assert torch.allclose(t, torch.full((4, 5), float(want))), (op, t)
nc = torch.full((6, 4), float(r + 1)).t()  # not contiguous
assert not nc.is_contiguous()
dist.all_reduce(nc)
assert (nc == tri).all()
t = torch.full((1000,), float(r))
work = dist.all_reduce(t, async_op=True)
fut = work.get_future()
work.wait()
assert work.is_completed()
assert (fut.wait()[0] == sum(range(n))).all()
assert (t == sum(range(n))).all()
chained = dist.all_reduce(torch.ones(3), async_op=True).get_future().then(lambda f: f.value()[0] * 2)
assert (chained.wait() == 2 * n).all()

# broadcast, reduce
for root in range(n):
    b = torch.full((3,), float(r))
    dist.broadcast(b, src=root)
    assert (b == root).all()
x = torch.full((2,), float(r + 1))
dist.reduce(x, dst=n - 1)
if r == n - 1:
    assert (x == tri).all(), x

# all_gather / all_gather_into_tensor / gather
outs = [torch.zeros(2, 2) for _ in range(n)]
dist.all_gather(outs, torch.full((2, 2), float(r)))
assert all((o == i).all() for i, o in enumerate(outs))
flat = torch.zeros(n * 3)
dist.all_gather_into_tensor(flat, torch.full((3,), float(r)))
assert flat.tolist() == [float(i) for i in range(n) for _ in range(3)]
gl = [torch.zeros(2) for _ in range(n)] if r == 0 else None
dist.gather(torch.full((2,), float(r)), gather_list=gl, dst=0)
if r == 0:
    assert all((g == i).all() for i, g in enumerate(gl))

# scatter, reduce_scatter, reduce_scatter_tensor
sc = torch.zeros(2)
dist.scatter(sc, scatter_list=[torch.full((2,), float(10 + i)) for i in range(n)] if r == 0 else None, src=0)
assert (sc == 10 + r).all()
o = torch.zeros(2)
dist.reduce_scatter(o, [torch.full((2,), float(i + r)) for i in range(n)])
assert (o == n * r + sum(range(n))).all(), o
o2 = torch.zeros(2)
dist.reduce_scatter_tensor(o2, torch.arange(2 * n, dtype=torch.float32))
assert o2.tolist() == [float(n * (2 * r)), float(n * (2 * r + 1))]

# all_to_all with lists and all_to_all_single with uneven splits
ao = [torch.zeros(i + 1) for i in range(n)]
dist.all_to_all(ao, [torch.full((r + 1,), float(100 * r + j)) for j in range(n)])
assert all((ao[i] == 100 * i + r).all() for i in range(n)), ao
send_splits = [j + 1 for j in range(n)]  # rank r sends j+1 rows to rank j
recv_splits = [r + 1] * n  # so rank r receives r+1 rows from everyone
inp = torch.cat([torch.full((j + 1, 2), float(10 * r + j)) for j in range(n)])
out = torch.zeros(sum(recv_splits), 2)
dist.all_to_all_single(out, inp, output_split_sizes=recv_splits, input_split_sizes=send_splits)
want = torch.cat([torch.full((r + 1, 2), float(10 * i + r)) for i in range(n)])
assert torch.equal(out, want), out

# point to point: blocking, and isend/irecv around a ring
if n > 1:
    if r == 0:
        dist.send(torch.tensor([42.0, 43.0]), dst=1)
    elif r == 1:
        got = torch.zeros(2)
        dist.recv(got, src=0)
        assert got.tolist() == [42.0, 43.0]
    s = dist.isend(torch.full((3,), float(r)), dst=(r + 1) % n)
    got = torch.zeros(3)
    rq = dist.irecv(got, src=(r - 1) % n)
    rq.wait()
    s.wait()
    assert (got == (r - 1) % n).all()
    ops = [
        dist.P2POp(dist.isend, torch.full((1,), float(r)), (r + 1) % n),
        dist.P2POp(dist.irecv, got[:1], (r - 1) % n),
    ]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    assert got[0] == (r - 1) % n

dist.barrier()

# new_group: a sub-group that not every rank belongs to, and the whole world again
members = list(range(0, n, 2)) if n > 2 else [0, 1]
g = dist.new_group(members)
if r in members:
    v = torch.tensor([float(r)])
    dist.all_reduce(v, group=g)
    assert v[0] == sum(members)
    assert dist.get_rank(g) == members.index(r)
    b = torch.tensor([float(r)])
    dist.broadcast(b, src=members[-1], group=g)  # a global rank, as torch takes it
    assert b[0] == members[-1]
everyone = dist.new_group(list(range(n)))
v = torch.ones(1)
dist.all_reduce(v, group=everyone)
assert v[0] == n

dist.destroy_process_group()
print(f"rank {r} of {n}: ok", flush=True)
