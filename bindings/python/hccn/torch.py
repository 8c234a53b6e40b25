"""The ``"hccn"`` backend of torch.distributed (CPU tensors).

    import hccn.torch                       # registers the backend
    import torch.distributed as dist
    dist.init_process_group("hccn")         # torchrun-style variables, or under hccnrun

The backend is a Python ``ProcessGroup`` subclass (the route of PyTorch's own
``test_c10d_pypg.py``) whose collectives call libhccn through :mod:`hccn`.

Rendezvous:

- **torchrun style** (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``): torch itself
  opens its TCPStore on ``MASTER_ADDR:MASTER_PORT`` before any backend is created and hands it to
  the backend. hccn uses it for one thing only, as NCCL does: group rank 0 calls
  ``hccn_get_unique_id`` (which starts hccn's own store on ``HCCN_BIND_ADDR``) and publishes the
  128-byte id under the group's prefix; the other ranks read it and call
  ``hccn_comm_init_rank``. Everything else (rendezvous of the ranks, authentication, traffic)
  is hccn's.
- **under hccnrun** (``HCCN_RANK``, ``HCCN_STORE``, ...): importing this module joins the world
  with ``hccn_init_from_env``, then rank 0 opens a torch TCPStore on a free port of
  ``MASTER_ADDR`` (``127.0.0.1`` unless set) and tells the other ranks the port over hccn; the
  module exports ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK`` and ``WORLD_SIZE`` so that
  ``init_process_group("hccn")`` needs no arguments. The backend then reuses that communicator.

Sub-groups (``dist.new_group``) of an hccn default group are made with ``hccn_new_group`` on the
world communicator. Every operation is queued on the group's hccn stream and returns a Work whose
``wait()`` blocks until it is done and whose ``get_future()`` completes when it is done.
"""

import os
import threading

import torch
import torch.distributed as dist

import hccn as _h

__all__ = ["ProcessGroupHCCN", "BACKEND"]

BACKEND = "hccn"

_OPS = {
    dist.ReduceOp.SUM: _h.ReduceOp.SUM,
    dist.ReduceOp.PRODUCT: _h.ReduceOp.PROD,
    dist.ReduceOp.MAX: _h.ReduceOp.MAX,
    dist.ReduceOp.MIN: _h.ReduceOp.MIN,
    dist.ReduceOp.AVG: _h.ReduceOp.AVG,
}


def _op(reduce_op):
    for k, v in _OPS.items():
        if reduce_op == k:
            return v
    raise ValueError(f"hccn: reduce op {reduce_op} is not supported (SUM, PRODUCT, MAX, MIN, AVG are)")


class _Work(dist._Work):
    """Completion of one hccn operation, plus the copies that finish it (non-contiguous
    tensors, list outputs) run once it is done."""

    def __init__(self, future, result, after=None):
        super().__init__()
        self._future = future  # hccn.Future or None (already done)
        self._result = result
        self._after = after
        self._lock = threading.Lock()
        self._finished = False
        self._error = None
        self._torch_future = None

    def _complete(self):
        with self._lock:
            if not self._finished:
                try:
                    if self._future is not None:
                        self._future.wait()
                    if self._after is not None:
                        self._after()
                except Exception as e:  # noqa: BLE001 - re-raised to every waiter
                    self._error = e
                self._finished = True
                self._future = None
                self._after = None
        if self._error is not None:
            raise self._error

    def wait(self, timeout=None):
        self._complete()
        return True

    def is_completed(self):
        if self._finished:
            return True
        return self._future is None or self._future.done()

    def is_success(self):
        return self._finished and self._error is None

    def get_future(self):
        if self._torch_future is None:
            fut = torch.futures.Future()
            self._torch_future = fut

            def finish():
                try:
                    self._complete()
                    fut.set_result(self._result)
                except Exception as e:  # noqa: BLE001 - handed to the future
                    fut.set_exception(e)

            if self.is_completed():
                finish()
            else:
                threading.Thread(target=finish, name="hccn-work", daemon=True).start()
        return self._torch_future


def _contig(t):
    """``t`` itself when contiguous, else a contiguous copy and a function that copies back."""
    if t.is_contiguous():
        return t, None
    c = t.contiguous()
    return c, (lambda: t.copy_(c))


def _chain(*fns):
    fns = [f for f in fns if f is not None]
    if not fns:
        return None

    def run():
        for f in fns:
            f()

    return run


class ProcessGroupHCCN(dist.ProcessGroup):
    """A torch.distributed process group over one hccn communicator (:class:`hccn.Group`)."""

    def __init__(self, group, rank, size):
        super().__init__(rank, size)
        self._g = group
        self._rank = rank
        self._size = size

    @property
    def hccn_group(self):
        return self._g

    def getBackendName(self):  # noqa: N802 - torch's name
        return BACKEND

    # torch.distributed asks a group for its per-device backend (batch_isend_irecv, for one);
    # a Python process group has none registered, and is its own backend for the CPU.
    supports_coalescing = False

    def _get_backend(self, device=None):
        return self

    def getRank(self):  # noqa: N802
        return self._rank

    def getSize(self):  # noqa: N802
        return self._size

    def __repr__(self):
        return f"<ProcessGroupHCCN rank {self._rank} of {self._size}>"

    def _one(self, tensors, what):
        if len(tensors) != 1:
            raise ValueError(f"hccn: {what} takes one tensor per rank (CPU), got {len(tensors)}")
        t = tensors[0]
        if t.device.type != "cpu":
            raise ValueError(f"hccn: {what}: tensor is on {t.device}; this backend takes CPU tensors")
        return t

    # -- collectives ------------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        t = self._one(tensors, "allreduce")
        op = _op(opts.reduceOp) if opts is not None else _h.ReduceOp.SUM
        c, back = _contig(t)
        return _Work(self._g.allreduce(c, op=op, async_op=True), tensors, back)

    def allreduce_coalesced(self, tensors, opts=None):
        op = _op(opts.reduceOp) if opts is not None else _h.ReduceOp.SUM
        futs, backs = [], []
        for t in tensors:
            c, back = _contig(t)
            futs.append(self._g.allreduce(c, op=op, async_op=True))
            backs.append(back)
        last = futs[-1] if futs else None
        return _Work(last, tensors, _chain(*[f.wait for f in futs[:-1]], *backs))

    def broadcast(self, tensors, opts):
        t = self._one(tensors, "broadcast")
        c, back = _contig(t)
        return _Work(self._g.broadcast(c, src=opts.rootRank, async_op=True), tensors, back)

    def reduce(self, tensors, opts):
        t = self._one(tensors, "reduce")
        c, back = _contig(t)
        fut = self._g.reduce(c, dst=opts.rootRank, op=_op(opts.reduceOp), async_op=True)
        return _Work(fut, tensors, back)

    def allgather(self, output_tensors, input_tensors, opts=None):
        t = self._one(input_tensors, "allgather")
        outs = output_tensors[0]
        if len(outs) != self._size:
            raise ValueError(f"hccn: allgather needs {self._size} output tensors, got {len(outs)}")
        c, _ = _contig(t)
        flat = torch.empty(self._size * c.numel(), dtype=c.dtype)
        fut = self._g.allgather(c, out=flat, async_op=True)

        def scatter_out():
            for i, o in enumerate(outs):
                o.copy_(flat[i * c.numel() : (i + 1) * c.numel()].view_as(o))

        return _Work(fut, output_tensors, scatter_out)

    def all_gather_single(self, output, input, opts=None):  # noqa: A002 - torch's name
        i, _ = _contig(input)
        o, back = _contig(output)
        return _Work(self._g.allgather(i, out=o, async_op=True), [output], back)

    _allgather_base = all_gather_single

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        out = self._one(output_tensors, "reduce_scatter")
        ins = input_tensors[0]
        if len(ins) != self._size:
            raise ValueError(f"hccn: reduce_scatter needs {self._size} input tensors, got {len(ins)}")
        op = _op(opts.reduceOp) if opts is not None else _h.ReduceOp.SUM
        flat = torch.cat([x.reshape(-1) for x in ins])
        o, back = _contig(out)
        return _Work(self._g.reduce_scatter(flat, out=o, op=op, async_op=True), output_tensors, back)

    def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002
        op = _op(opts.reduceOp) if opts is not None else _h.ReduceOp.SUM
        i, _ = _contig(input)
        o, back = _contig(output)
        return _Work(self._g.reduce_scatter(i, out=o, op=op, async_op=True), [output], back)

    _reduce_scatter_base = reduce_scatter_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        n = self._size
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError(f"hccn: all_to_all needs {n} input and {n} output tensors")
        send = [x.numel() for x in input_tensors]
        recv = [x.numel() for x in output_tensors]
        flat_in = torch.cat([x.reshape(-1) for x in input_tensors])
        flat_out = torch.empty(sum(recv), dtype=flat_in.dtype)
        fut = self._g.alltoallv(flat_in, send, flat_out, recv, async_op=True)

        def scatter_out():
            off = 0
            for o, k in zip(output_tensors, recv):
                o.copy_(flat_out[off : off + k].view_as(o))
                off += k

        return _Work(fut, output_tensors, scatter_out)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # noqa: A002
        n = self._size
        i, _ = _contig(input)
        o, back = _contig(output)
        row_in = i[0].numel() if i.dim() > 0 and i.shape[0] else 1
        row_out = o[0].numel() if o.dim() > 0 and o.shape[0] else 1
        if not input_split_sizes:
            send = [i.numel() // n] * n
        else:
            send = [int(k) * row_in for k in input_split_sizes]
        if not output_split_sizes:
            recv = [o.numel() // n] * n
        else:
            recv = [int(k) * row_out for k in output_split_sizes]
        return _Work(self._g.alltoallv(i, send, o, recv, async_op=True), [output], back)

    alltoall_base = all_to_all_single

    def gather(self, output_tensors, input_tensors, opts):
        t = self._one(input_tensors, "gather")
        c, _ = _contig(t)
        root = opts.rootRank
        flat = torch.empty(self._size * c.numel(), dtype=c.dtype)
        fut = self._g.gather(c, flat, dst=root, async_op=True)
        outs = output_tensors[0] if output_tensors else []

        def scatter_out():
            if self._rank == root:
                for i, o in enumerate(outs):
                    o.copy_(flat[i * c.numel() : (i + 1) * c.numel()].view_as(o))

        return _Work(fut, output_tensors, scatter_out)

    def scatter(self, output_tensors, input_tensors, opts):
        out = self._one(output_tensors, "scatter")
        root = opts.rootRank
        o, back = _contig(out)
        if self._rank == root:
            flat = torch.cat([x.reshape(-1) for x in input_tensors[0]])
        else:
            flat = torch.empty(self._size * o.numel(), dtype=o.dtype)
        return _Work(self._g.scatter(flat, o, src=root, async_op=True), output_tensors, back)

    def barrier(self, opts=None):
        return _Work(self._g.barrier(async_op=True), [])

    # -- point to point (tags are not carried: messages between two ranks match in order) -----

    def send(self, tensors, dst, tag=0):
        t = self._one(tensors, "send")
        c, _ = _contig(t)
        return _Work(self._g.send(c, dst, async_op=True), tensors)

    def recv(self, tensors, src, tag=0):
        t = self._one(tensors, "recv")
        c, back = _contig(t)
        return _Work(self._g.recv(c, src, async_op=True), tensors, back)

    def abort(self):
        global _world_pg
        g, self._g = self._g, None
        if g is None:
            return
        if g is _world_pg:
            _world_pg = None
        if g is _h._world:
            _h.finalize()  # a later init_process_group starts afresh
        else:
            g.destroy()

    def shutdown(self):
        self.abort()


# ---------------------------------------------------------------------------------------------
# Creation

_world_pg = None  # the hccn.Group behind the default process group
_hccnrun_store = None  # the TCPStore rank 0 hosts for torch under hccnrun


def _unique_id_via(store, rank):
    key = "hccn_unique_id"
    if rank == 0:
        uid = _h.get_unique_id()
        store.set(key, uid)
        return uid
    return bytes(store.get(key))


def _create(opts, backend_options=None):
    global _world_pg
    rank, size = opts.group_rank, opts.group_size
    ranks = list(opts.global_ranks_in_group)
    if not ranks:  # the default group
        g = _h._world
        if g is None or g._h is None or g.rank != rank or g.size != size:
            g = _h._init_rank(rank, size, _unique_id_via(opts.store, rank))
            _h._adopt_world(g)
        _world_pg = g
    elif _world_pg is not None and _world_pg._h is not None:
        g = _world_pg.new_group(ranks)
    else:  # the default group is another backend's: rendezvous through torch's store
        g = _h._init_rank(rank, size, _unique_id_via(opts.store, rank))
    return ProcessGroupHCCN(g, rank, size)


def _torchrun_env_missing():
    return any(k not in os.environ for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"))


def _join_from_hccnrun():
    """Under hccnrun: join the world and export the torchrun variables (see the module doc)."""
    global _hccnrun_store
    try:
        world = _h.init()
    except _h.InvalidArgumentError:
        return  # not under hccnrun (HCCN_RANK etc. unset): leave it to torch's own checks
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = torch.zeros(1, dtype=torch.int64)
    if world.rank == 0:
        _hccnrun_store = dist.TCPStore(addr, 0, world.size, True, wait_for_workers=False)
        port[0] = _hccnrun_store.port
    world.broadcast(port, src=0)
    os.environ.setdefault("MASTER_ADDR", addr)
    os.environ["MASTER_PORT"] = str(int(port[0]))
    os.environ["RANK"] = str(world.rank)
    os.environ["WORLD_SIZE"] = str(world.size)
    # Every rank, rank 0 included, is a client of the store rank 0 already hosts.
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"


def _register():
    if BACKEND.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])


_register()
if _torchrun_env_missing() and not _h.is_initialized():
    _join_from_hccnrun()
