"""Every function of the hccn package on numpy arrays and torch CPU tensors, checked exactly.

Run on N ranks under hccnrun (tests/tests/python.rs runs 3 in the torch venv; tests/tests/wheel.rs
runs 2 from the wheel in a venv with numpy only). Prints "rank r of n: ok" when every check
passed, and "numpy only" when torch is not installed (its checks skipped); any failure raises
(non-zero exit).
"""

import sys

import numpy as np

try:
    import torch
except ImportError:
    torch = None

import hccn

w = hccn.init()
r, n = hccn.get_rank(), hccn.get_world_size()
assert (w.rank, w.size) == (r, n)


def same_memory(before_ptr, x):
    p = x.ctypes.data if isinstance(x, np.ndarray) else x.data_ptr()
    assert p == before_ptr, "the operation replaced the buffer instead of working in place"


# allreduce on every numpy type with every op, in place
for dt in [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64, np.float16, np.float32, np.float64]:
    for op, want in [
        (hccn.ReduceOp.SUM, sum(range(1, n + 1))),
        (hccn.ReduceOp.PROD, int(np.prod(range(1, n + 1)))),
        (hccn.ReduceOp.MAX, n),
        (hccn.ReduceOp.MIN, 1),
    ]:
        x = np.full(37, r + 1, dtype=dt)
        p = x.ctypes.data
        hccn.allreduce(x, op=op)
        same_memory(p, x)
        assert (x == dt(want)).all(), (dt, op, x)

# torch types, bfloat16 included, and AVG
for dt in [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int64] if torch else []:
    t = torch.full((5, 3), float(r + 1), dtype=dt)
    p = t.data_ptr()
    hccn.allreduce(t)
    same_memory(p, t)
    assert (t == sum(range(1, n + 1))).all(), (dt, t)
a = np.full(8, 2.0 * r, dtype=np.float32)
hccn.allreduce(a, op=hccn.ReduceOp.AVG)
assert np.allclose(a, n - 1), a
if torch:
    t = torch.full((8,), float(2 * r), dtype=torch.float32)
    hccn.allreduce(t, op=hccn.ReduceOp.AVG)
    assert torch.allclose(t, torch.full((8,), float(n - 1))), t

# async: a future per operation, several in flight, then a blocking one after them
xs = [np.full(1000, r + i, dtype=np.float32) for i in range(4)]
futs = [hccn.allreduce(x, async_op=True) for x in xs]
y = np.full(3, r, dtype=np.int64)
hccn.allreduce(y)  # issued after the queued ones, so it runs after them
for i, (x, f) in enumerate(zip(xs, futs)):
    assert f.wait() is None
    assert f.done()
    assert (x == sum(k + i for k in range(n))).all()
assert (y == sum(range(n))).all()

# compressed allreduce (FP32 over BF16 / FP16): values exactly representable stay exact
for wire in ["bf16", "fp16"] + ([torch.bfloat16] if torch else []):
    c = np.full(64, 0.5 * (r + 1), dtype=np.float32)
    hccn.allreduce(c, compress_dtype=wire)
    assert (c == 0.5 * sum(range(1, n + 1))).all(), (wire, c)

# broadcast from every root
for root in range(n):
    b = np.full(6, float(r)) if r == root else np.zeros(6)
    hccn.broadcast(b, src=root)
    assert (b == root).all()
    if torch:
        b = torch.full((6,), float(r)) if r == root else torch.zeros(6)
        hccn.broadcast(b, src=root)
        assert (b == root).all()

# allgather into a new array, and into a given one
g = hccn.allgather(np.array([r, 10 * r], dtype=np.int32))
assert g.tolist() == [v for k in range(n) for v in (k, 10 * k)], g
outs = [(np.empty(n * 2), np.array([float(r), 1.0]))]
if torch:
    outs.append((torch.empty(n * 2, dtype=torch.float64), torch.tensor([float(r), 1.0], dtype=torch.float64)))
for out, mine in outs:
    res = hccn.allgather(mine, out=out)
    assert res is out and out.tolist() == [v for k in range(n) for v in (float(k), 1.0)]

# reduce_scatter: block k of the sum lands on rank k
x = np.arange(3 * n, dtype=np.float64) * (r + 1)
rs = hccn.reduce_scatter(x)
tri = sum(range(1, n + 1))
assert rs.tolist() == [float(j * tri) for j in range(3 * r, 3 * r + 3)], rs

# alltoall: block j of rank i goes to rank j, lands as block i
a = hccn.alltoall(np.array([100 * r + j for j in range(n)], dtype=np.int64))
assert a.tolist() == [100 * i + r for i in range(n)], a

# send/recv around a ring, async send then blocking recv
if n > 1:
    s = np.array([r, r * r], dtype=np.float32)
    f = hccn.send(s, (r + 1) % n, async_op=True)
    got = np.zeros(2, dtype=np.float32)
    hccn.recv(got, (r - 1) % n)
    f.wait()
    prev = (r - 1) % n
    assert got.tolist() == [prev, prev * prev], got

hccn.barrier()
hccn.barrier(async_op=True).wait()

# a sub-group of the even ranks (others get None without communicating)
evens = list(range(0, n, 2))
sub = hccn.new_group(evens)
if r in evens:
    assert sub.rank == evens.index(r) and sub.size == len(evens)
    v = np.array([r], dtype=np.int32)
    hccn.allreduce(v, group=sub)
    assert v[0] == sum(evens)
    sub.destroy()
else:
    assert sub is None
# split by parity
half = w.split(r % 2, key=r)
v = np.array([1], dtype=np.int32)
half.allreduce(v)
assert v[0] == len(range(r % 2, n, 2))
half.destroy()

# the fusion bucket: many tensors of two types, a small capacity so it flushes on its own too
bucket = hccn.GradientBucket(bucket_size_mb=1 / 1024)  # 1 KiB
parts = [np.full(k * 30 + 1, r + 1, dtype=np.float32) for k in range(12)]
if torch:
    parts += [torch.full((50,), float(r + 1), dtype=torch.float64), torch.full((400,), float(r), dtype=torch.float64)]
else:
    parts += [np.full(50, float(r + 1)), np.full(400, float(r))]
ptrs = [p.ctypes.data if isinstance(p, np.ndarray) else p.data_ptr() for p in parts]
for p in parts:
    bucket.add(p)
bucket.allreduce()
for p, ptr in zip(parts, ptrs):
    same_memory(ptr, p)
for p in parts[:-1]:
    assert (p == tri).all(), p
assert (parts[-1] == sum(range(n))).all()
bucket.clear()

# errors: a subclass of HccnError with the code and the library's message; the group stays usable
try:
    hccn.broadcast(np.zeros(2), src=n + 5)
    raise AssertionError("an out-of-range root must fail")
except hccn.HccnError as e:
    assert isinstance(e, hccn.InvalidArgumentError) and isinstance(e, ValueError)
    assert e.code == hccn.Result.ERROR_INVALID_ARGUMENT
    assert "root" in e.message and str(n + 5) in e.message, e.message
try:
    hccn.allreduce(np.zeros((4, 4))[:, 1])
    raise AssertionError("a strided view must be refused")
except hccn.InvalidArgumentError as e:
    assert "contiguous" in str(e)
try:
    hccn.allreduce(np.zeros(4, dtype=np.complex64))
    raise AssertionError("complex must be refused")
except hccn.InvalidArgumentError as e:
    assert "complex64" in str(e)
try:
    hccn.allreduce(np.ones(4, dtype=np.int32), compress_dtype="fp16")
    raise AssertionError("compressing integers must fail")
except hccn.HccnError as e:
    assert e.code == hccn.Result.ERROR_INVALID_ARGUMENT, e
z = np.ones(2, dtype=np.float32)
hccn.allreduce(z)
assert (z == n).all()

assert hccn.version() >= (0, 1, 0)
hccn.finalize()
kinds = f"torch {torch.__version__}" if torch else "numpy only"
print(f"rank {r} of {n}: ok (library {hccn._raw.library_path}; {kinds})")
sys.stdout.flush()
