"""hccn for Python: collectives in place on numpy arrays and torch CPU tensors.

    import numpy as np, hccn
    hccn.init()                      # under hccnrun; or init(rank=, world_size=, store=)
    x = np.arange(4, dtype=np.float32)
    hccn.allreduce(x)                # x now holds the sum over all ranks
    f = hccn.allreduce(x, op=hccn.ReduceOp.MAX, async_op=True)
    f.wait()

Buffers are never copied: the library reads and writes the memory of the array or tensor
itself (``__array_interface__`` / ``data_ptr()``), which must be contiguous and, for tensors, on
the CPU. Every failure raises an :class:`HccnError` subclass carrying the C result code and the
library's ``hccn_get_last_error`` text. The raw C functions are in :mod:`hccn._raw`.
"""

import ctypes
import enum
import os
import threading
import time
from ctypes import byref, c_int32, c_uint32, c_uint64, c_void_p

from . import _raw
from ._raw import DataType, Result, lib

__version__ = "0.1.0"

__all__ = [
    "HccnError",
    "ReduceOp",
    "DataType",
    "Result",
    "Group",
    "Future",
    "GradientBucket",
    "FileStore",
    "init",
    "is_initialized",
    "finalize",
    "world",
    "get_rank",
    "get_world_size",
    "allreduce",
    "allgather",
    "broadcast",
    "reduce_scatter",
    "alltoall",
    "send",
    "recv",
    "barrier",
    "new_group",
    "get_unique_id",
    "version",
    "get_include",
    "get_lib_dir",
]


# ---------------------------------------------------------------------------------------------
# Errors


class HccnError(RuntimeError):
    """A failed hccn call: ``code`` is the :class:`Result`, ``message`` the library's text."""

    def __init__(self, code, message):
        self.code = Result(code) if code in Result._value2member_map_ else code
        self.message = message
        name = self.code.name if isinstance(self.code, Result) else str(code)
        super().__init__(f"hccn: {name} ({int(code)}): {message}")


class InvalidArgumentError(HccnError, ValueError):
    pass


class NullPointerError(HccnError, ValueError):
    pass


class OutOfMemoryError(HccnError, MemoryError):
    pass


class InternalError(HccnError):
    pass


class NotSupportedError(HccnError):
    pass


class NotFoundError(HccnError):
    pass


class UnavailableError(HccnError):
    pass


class SystemCallError(HccnError, OSError):
    pass


class TimeoutError(HccnError, TimeoutError):  # noqa: A001 - also a builtin TimeoutError
    pass


class ConnectError(HccnError, ConnectionError):
    pass


class TransferError(HccnError, ConnectionError):
    pass


class BackendError(HccnError):
    pass


class RemoteError(HccnError):
    pass


class RankFailedError(HccnError):
    """A member died or is unreachable (``HCCN_ERROR_RANK_FAILED``)."""


class RevokedError(HccnError):
    pass


class AbortedError(HccnError):
    pass


class AuthError(HccnError):
    pass


class StoreError(HccnError):
    pass


class StaleEpochError(HccnError):
    pass


_ERRORS = {
    Result.ERROR_INVALID_ARGUMENT: InvalidArgumentError,
    Result.ERROR_NULL_POINTER: NullPointerError,
    Result.ERROR_OUT_OF_MEMORY: OutOfMemoryError,
    Result.ERROR_INTERNAL: InternalError,
    Result.ERROR_NOT_SUPPORTED: NotSupportedError,
    Result.ERROR_NOT_FOUND: NotFoundError,
    Result.ERROR_UNAVAILABLE: UnavailableError,
    Result.ERROR_SYSTEM: SystemCallError,
    Result.ERROR_TIMEOUT: TimeoutError,
    Result.ERROR_CONNECT: ConnectError,
    Result.ERROR_TRANSFER: TransferError,
    Result.ERROR_BACKEND: BackendError,
    Result.ERROR_REMOTE: RemoteError,
    Result.ERROR_RANK_FAILED: RankFailedError,
    Result.ERROR_REVOKED: RevokedError,
    Result.ERROR_ABORTED: AbortedError,
    Result.ERROR_AUTH: AuthError,
    Result.ERROR_STORE: StoreError,
    Result.ERROR_STALE_EPOCH: StaleEpochError,
}

for _cls in set(_ERRORS.values()):
    _cls.__module__ = __name__


def _error(code, message=None):
    if message is None:
        raw = lib.hccn_get_last_error() or b""
        message = raw.decode("utf-8", "replace")
        if not message:
            message = (lib.hccn_get_error_string(code) or b"").decode("utf-8", "replace")
    return _ERRORS.get(code, HccnError)(code, message)


def _check(code):
    if code != Result.SUCCESS:
        raise _error(code)


def _invalid(message):
    return InvalidArgumentError(Result.ERROR_INVALID_ARGUMENT, message)


def version():
    """The library's version as ``(major, minor, patch)``."""
    v = c_int32()
    _check(lib.hccn_get_version(byref(v)))
    return (v.value // 10000, v.value // 100 % 100, v.value % 100)


def get_include():
    """The directory of ``hccn.h`` and ``hccn.hpp`` inside the installed package, for extension
    modules built against it (as ``numpy.get_include()``)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")


def get_lib_dir():
    """The directory of the package's ``libhccn.so.1``: link an extension module with
    ``-l:libhccn.so.1`` there and an rpath to it (``$ORIGIN/lib`` from the package)."""
    return _raw.LIB_DIR


# ---------------------------------------------------------------------------------------------
# Reduce ops and buffers


class ReduceOp(enum.IntEnum):
    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    AVG = 4


_NUMPY_TYPES = {
    ("i", 1): DataType.INT8,
    ("i", 2): DataType.INT16,
    ("i", 4): DataType.INT32,
    ("i", 8): DataType.INT64,
    ("u", 1): DataType.UINT8,
    ("u", 2): DataType.UINT16,
    ("u", 4): DataType.UINT32,
    ("u", 8): DataType.UINT64,
    ("f", 2): DataType.FP16,
    ("f", 4): DataType.FP32,
    ("f", 8): DataType.FP64,
    ("b", 1): DataType.UINT8,  # bool: moved as bytes (reductions on it are not meaningful)
}

_TORCH_TYPES = {
    "torch.int8": DataType.INT8,
    "torch.int16": DataType.INT16,
    "torch.int32": DataType.INT32,
    "torch.int64": DataType.INT64,
    "torch.uint8": DataType.UINT8,
    "torch.uint16": DataType.UINT16,
    "torch.uint32": DataType.UINT32,
    "torch.uint64": DataType.UINT64,
    "torch.float16": DataType.FP16,
    "torch.float32": DataType.FP32,
    "torch.float64": DataType.FP64,
    "torch.bfloat16": DataType.BF16,
    "torch.bool": DataType.UINT8,
}

_ITEMSIZE = {
    DataType.INT8: 1,
    DataType.UINT8: 1,
    DataType.INT16: 2,
    DataType.UINT16: 2,
    DataType.FP16: 2,
    DataType.BF16: 2,
    DataType.INT32: 4,
    DataType.UINT32: 4,
    DataType.FP32: 4,
    DataType.INT64: 8,
    DataType.UINT64: 8,
    DataType.FP64: 8,
}


class _Buf:
    """Address, element count and data type of an array or tensor, and the object itself."""

    __slots__ = ("ptr", "count", "dtype", "obj")

    def __init__(self, ptr, count, dtype, obj):
        self.ptr = ptr
        self.count = count
        self.dtype = dtype
        self.obj = obj

    def at(self, elements):
        return self.ptr + elements * _ITEMSIZE[self.dtype]


def _is_torch(x):
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


def _buf(x, what="buffer", writable=True):
    if _is_torch(x):
        if x.device.type != "cpu":
            raise _invalid(f"{what} is a tensor on {x.device}; hccn's Python layer takes CPU tensors")
        if not x.is_contiguous():
            raise _invalid(f"{what} is not contiguous; pass x.contiguous() and copy the result back")
        dt = _TORCH_TYPES.get(str(x.dtype))
        if dt is None:
            raise _invalid(f"{what} has dtype {x.dtype}, which hccn does not carry")
        n = x.numel()
        return _Buf(x.data_ptr() if n else None, n, dt, x)
    iface = getattr(x, "__array_interface__", None)
    if iface is None:
        raise _invalid(f"{what} must be a numpy array, a torch CPU tensor or expose __array_interface__")
    import numpy as np

    a = x if isinstance(x, np.ndarray) else np.asarray(x)
    if a.__array_interface__["data"][0] != iface["data"][0]:
        raise _invalid(f"{what} could not be used without a copy")
    if not a.flags.c_contiguous:
        raise _invalid(f"{what} is not C-contiguous; pass np.ascontiguousarray(x) and copy the result back")
    if writable and not a.flags.writeable:
        raise _invalid(f"{what} is read-only but the operation writes it")
    dt = _NUMPY_TYPES.get((a.dtype.kind, a.dtype.itemsize))
    if dt is None or a.dtype.byteorder == (">" if np.little_endian else "<"):
        raise _invalid(f"{what} has dtype {a.dtype}, which hccn does not carry")
    n = int(a.size)
    return _Buf(a.ctypes.data if n else None, n, dt, x)


def _empty_like(x, count_factor=1, divide=1):
    """A new array or tensor of ``x``'s type with ``count*count_factor/divide`` elements."""
    if _is_torch(x):
        import torch

        n = x.numel() * count_factor // divide
        return torch.empty(n, dtype=x.dtype)
    import numpy as np

    a = np.asarray(x)
    return np.empty(a.size * count_factor // divide, dtype=a.dtype)


def _wire_dtype(compress_dtype):
    if compress_dtype is None:
        return None
    if isinstance(compress_dtype, DataType):
        return compress_dtype
    name = str(compress_dtype).lower().replace("torch.", "").replace("<class 'numpy.", "").rstrip("'>")
    table = {"fp16": DataType.FP16, "float16": DataType.FP16, "half": DataType.FP16}
    table.update({"bf16": DataType.BF16, "bfloat16": DataType.BF16})
    if name not in table:
        raise _invalid(f"compress_dtype {compress_dtype!r} is not fp16 or bf16")
    return table[name]


# ---------------------------------------------------------------------------------------------
# Futures


class Future:
    """An operation queued on a group's stream; ``wait()`` returns its result (or raises)."""

    def __init__(self, group, event, keep, result=None):
        self._group = group
        self._event = event
        self._keep = keep  # buffers stay alive until the operation has run
        self._result = result
        self._done = event is None
        self._error = None

    def done(self):
        """True once the operation has finished (successfully or not)."""
        if self._done:
            return True
        r = lib.hccn_event_query(self._event)
        if r == Result.IN_PROGRESS:
            return False
        self._finish(r)
        return True

    def _finish(self, r):
        self._done = True
        if r != Result.SUCCESS:
            self._error = _error(r)  # the stream's (sticky) error of the marked work
        lib.hccn_event_destroy(self._event)
        self._event = None
        self._keep = None

    def wait(self, timeout=None):
        """Blocks until the operation is complete; returns its result or raises HccnError."""
        if not self._done:
            self._finish(lib.hccn_event_synchronize(self._event))
        if self._error is not None:
            raise self._error
        return self._result

    def result(self):
        return self.wait()

    def __del__(self):
        ev = getattr(self, "_event", None)
        if ev is not None:
            try:
                lib.hccn_event_synchronize(ev)
                lib.hccn_event_destroy(ev)
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass


# ---------------------------------------------------------------------------------------------
# Groups (communicators)


class Group:
    """One communicator. All module functions take ``group=``; ``None`` means the world."""

    def __init__(self, handle, owned=True):
        self._h = c_void_p(handle)
        self._stream = None
        self._lock = threading.RLock()
        self._owned = owned
        r, s = c_uint32(), c_uint32()
        _check(lib.hccn_comm_rank(self._h, byref(r)))
        _check(lib.hccn_comm_size(self._h, byref(s)))
        self.rank = r.value
        self.size = s.value

    @property
    def handle(self):
        """The ``hccn_comm *`` (for the raw layer)."""
        return self._h

    def __repr__(self):
        return f"<hccn.Group rank {self.rank} of {self.size}>"

    # Every call on a communicator is issued in program order. Blocking calls run with a NULL
    # stream once the group's stream is idle; asynchronous ones are queued on that stream.
    def _issue(self, call, async_op, keep, result=None):
        with self._lock:
            if self._h is None:
                raise _invalid("the group was destroyed")
            if not async_op:
                self._drain()
                _check(call(None))
                return None
            if self._stream is None:
                s = c_void_p()
                _check(lib.hccn_stream_create(byref(s)))
                self._stream = s
            _check(call(self._stream))
            ev = c_void_p()
            _check(lib.hccn_event_create(byref(ev)))
            r = lib.hccn_event_record(ev, self._stream)
            if r != Result.SUCCESS:
                err = _error(r)
                lib.hccn_event_destroy(ev)
                raise err
            return Future(self, ev, keep, result)

    def _drain(self):
        if self._stream is not None:
            _check(lib.hccn_stream_synchronize(self._stream))

    def synchronize(self):
        """Waits for every asynchronous operation issued on this group."""
        with self._lock:
            self._drain()

    # -- collectives ------------------------------------------------------------------------

    def allreduce(self, x, op=ReduceOp.SUM, async_op=False, compress_dtype=None):
        b = _buf(x, "x")
        op = int(ReduceOp(op))
        wire = _wire_dtype(compress_dtype)
        if wire is None:

            def call(s):
                return lib.hccn_allreduce(b.ptr, b.ptr, b.count, b.dtype, op, self._h, s)

        else:

            def call(s):
                return lib.hccn_allreduce_compressed(b.ptr, b.ptr, b.count, b.dtype, wire, op, self._h, s)

        return self._issue(call, async_op, [x])

    def broadcast(self, x, src=0, async_op=False):
        b = _buf(x, "x")
        return self._issue(lambda s: lib.hccn_broadcast(b.ptr, b.count, b.dtype, src, self._h, s), async_op, [x])

    def allgather(self, x, out=None, async_op=False):
        """Gathers every rank's ``x`` into ``out`` (``size * x.size`` elements, rank order)."""
        b = _buf(x, "x", writable=False)
        if out is None:
            out = _empty_like(x, self.size)
        o = _buf(out, "out")
        if o.dtype != b.dtype or o.count != b.count * self.size:
            raise _invalid(f"out must have {b.count * self.size} elements of x's dtype, has {o.count}")
        fut = self._issue(
            lambda s: lib.hccn_allgather(b.ptr, o.ptr, b.count, b.dtype, self._h, s), async_op, [x, out], out
        )
        return fut if async_op else out

    def reduce_scatter(self, x, out=None, op=ReduceOp.SUM, async_op=False):
        """Reduces ``x`` (``size * n`` elements) over ranks; this rank's block of ``n`` lands in ``out``."""
        b = _buf(x, "x", writable=False)
        if b.count % self.size:
            raise _invalid(f"x has {b.count} elements, not a multiple of the group size {self.size}")
        n = b.count // self.size
        if out is None:
            out = _empty_like(x, 1, self.size)
        o = _buf(out, "out")
        if o.dtype != b.dtype or o.count != n:
            raise _invalid(f"out must have {n} elements of x's dtype, has {o.count}")
        op = int(ReduceOp(op))
        fut = self._issue(
            lambda s: lib.hccn_reduce_scatter(b.ptr, o.ptr, n, b.dtype, op, self._h, s), async_op, [x, out], out
        )
        return fut if async_op else out

    def alltoall(self, x, out=None, async_op=False):
        """Block ``j`` of ``x`` goes to rank ``j``; block ``i`` of ``out`` comes from rank ``i``."""
        b = _buf(x, "x", writable=False)
        if b.count % self.size:
            raise _invalid(f"x has {b.count} elements, not a multiple of the group size {self.size}")
        n = b.count // self.size
        if out is None:
            out = _empty_like(x)
        o = _buf(out, "out")
        if o.dtype != b.dtype or o.count != b.count:
            raise _invalid(f"out must have {b.count} elements of x's dtype, has {o.count}")
        fut = self._issue(
            lambda s: lib.hccn_alltoall(b.ptr, o.ptr, n, b.dtype, self._h, s), async_op, [x, out], out
        )
        return fut if async_op else out

    def reduce(self, x, dst=0, op=ReduceOp.SUM, async_op=False):
        """In place on rank ``dst``: ``x`` becomes the reduction; other ranks' ``x`` is unchanged."""
        b = _buf(x, "x")
        op = int(ReduceOp(op))
        return self._issue(
            lambda s: lib.hccn_reduce(b.ptr, b.ptr, b.count, b.dtype, op, dst, self._h, s), async_op, [x]
        )

    def gather(self, x, out, dst=0, async_op=False):
        """Rank ``dst``'s ``out`` (``size * x.size`` elements) receives every ``x`` in rank order;
        other ranks pass any buffer of that size (it is not touched)."""
        b = _buf(x, "x", writable=False)
        o = _buf(out, "out")
        if o.dtype != b.dtype or o.count != b.count * self.size:
            raise _invalid(f"out must have {b.count * self.size} elements of x's dtype, has {o.count}")
        return self._issue(
            lambda s: lib.hccn_gather(b.ptr, o.ptr, b.count, b.dtype, dst, self._h, s), async_op, [x, out]
        )

    def scatter(self, x, out, src=0, async_op=False):
        """Block ``i`` of rank ``src``'s ``x`` (``size * out.size`` elements) lands in rank ``i``'s ``out``."""
        b = _buf(x, "x", writable=False)
        o = _buf(out, "out")
        if o.dtype != b.dtype or b.count != o.count * self.size:
            raise _invalid(f"x must have {o.count * self.size} elements of out's dtype, has {b.count}")
        return self._issue(
            lambda s: lib.hccn_scatter(b.ptr, o.ptr, o.count, b.dtype, src, self._h, s), async_op, [x, out]
        )

    def alltoallv(self, x, send_counts, out, recv_counts, async_op=False):
        """Rank ``j`` gets ``send_counts[j]`` elements of ``x`` (blocks back to back); ``out`` gets
        ``recv_counts[i]`` elements from rank ``i``, back to back."""
        b = _buf(x, "x", writable=False)
        o = _buf(out, "out")
        n = self.size
        if len(send_counts) != n or len(recv_counts) != n:
            raise _invalid(f"send_counts and recv_counts need {n} entries")
        if sum(send_counts) > b.count or sum(recv_counts) > o.count or o.dtype != b.dtype:
            raise _invalid("the counts do not fit x and out (or their dtypes differ)")
        sc = (c_uint64 * n)(*send_counts)
        rc = (c_uint64 * n)(*recv_counts)
        sd = (c_uint64 * n)(*[sum(send_counts[:i]) for i in range(n)])
        rd = (c_uint64 * n)(*[sum(recv_counts[:i]) for i in range(n)])
        sp = b.ptr if b.ptr is not None else o.ptr
        return self._issue(
            lambda s: lib.hccn_alltoallv(sp, sc, sd, o.ptr, rc, rd, b.dtype, self._h, s),
            async_op,
            [x, out, sc, rc, sd, rd],
        )

    def send(self, x, dst, async_op=False):
        b = _buf(x, "x", writable=False)
        return self._issue(lambda s: lib.hccn_send(b.ptr, b.count, b.dtype, dst, self._h, s), async_op, [x])

    def recv(self, x, src, async_op=False):
        b = _buf(x, "x")
        return self._issue(lambda s: lib.hccn_recv(b.ptr, b.count, b.dtype, src, self._h, s), async_op, [x])

    def barrier(self, async_op=False):
        return self._issue(lambda s: lib.hccn_barrier(self._h, s), async_op, [])

    # -- sub-communicators ------------------------------------------------------------------

    def new_group(self, ranks):
        """A group of ``ranks`` (ranks of this group, new rank = index in the list).

        Members create it together; a rank not in ``ranks`` gets ``None`` without communicating,
        so every rank may call it (as with torch.distributed.new_group)."""
        ranks = [int(r) for r in ranks]
        if self.rank not in ranks:
            return None
        arr = (c_uint32 * len(ranks))(*ranks)
        out = c_void_p()
        with self._lock:
            self._drain()
            _check(lib.hccn_new_group(self._h, arr, len(ranks), byref(out)))
        return Group(out.value)

    def split(self, color, key=0):
        """Collective over this group: ranks with the same ``color`` form a group (``None`` if color < 0)."""
        out = c_void_p()
        with self._lock:
            self._drain()
            _check(lib.hccn_comm_split(self._h, int(color), int(key), byref(out)))
        return Group(out.value) if out.value else None

    def destroy(self):
        """Frees the communicator once its queued operations are done."""
        with self._lock:
            if self._h is None:
                return
            if self._stream is not None:
                lib.hccn_stream_destroy(self._stream)
                self._stream = None
            h, self._h = self._h, None
            if self._owned:
                _check(lib.hccn_comm_destroy(h))


# ---------------------------------------------------------------------------------------------
# Fusion


class GradientBucket:
    """Fuses many allreduces into few (``hccn_bucket_*``): ``add`` tensors, then ``allreduce()``.

    Each data type gets its own C bucket of ``bucket_size_mb`` MiB. Every rank must make the same
    sequence of ``add`` calls (same sizes and dtypes) and ``allreduce`` calls. An added buffer
    belongs to the library until ``allreduce()`` returns; it then holds the reduced values."""

    def __init__(self, bucket_size_mb=25, op=ReduceOp.SUM, group=None):
        self._group = _group(group)
        self._capacity = int(bucket_size_mb * (1 << 20))
        if self._capacity <= 0:
            raise _invalid("bucket_size_mb must be positive")
        self._op = int(ReduceOp(op))
        self._buckets = {}  # dtype -> hccn_bucket *, in creation order
        self._keep = []

    def _bucket(self, dtype):
        h = self._buckets.get(dtype)
        if h is None:
            h = c_void_p()
            _check(lib.hccn_bucket_create(self._group._h, self._capacity, dtype, self._op, byref(h)))
            self._buckets[dtype] = h
        return h

    def add(self, x):
        b = _buf(x, "x")
        g = self._group
        with g._lock:
            g._drain()
            h = self._bucket(b.dtype)
            self._keep.append(x)
            _check(lib.hccn_bucket_add(h, b.ptr, b.count, None))

    def allreduce(self):
        """Reduces everything added since the last call; the buffers then hold the results."""
        g = self._group
        with g._lock:
            g._drain()
            for h in self._buckets.values():
                _check(lib.hccn_bucket_flush(h, None))
        self._keep = []

    def clear(self):
        """Drops pending tensors (no communication) and frees the C buckets."""
        for h in self._buckets.values():
            lib.hccn_bucket_destroy(h)
        self._buckets = {}
        self._keep = []

    def __del__(self):
        try:
            self.clear()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


# ---------------------------------------------------------------------------------------------
# Stores for init(rank=, world_size=, store=)


class FileStore:
    """A rendezvous through a shared file system: ``set`` writes a file atomically, ``get`` waits."""

    def __init__(self, path, timeout=300.0):
        self.path = path
        self.timeout = timeout
        os.makedirs(path, exist_ok=True)

    def _file(self, key):
        return os.path.join(self.path, key.replace("/", "_"))

    def set(self, key, value):
        tmp = self._file(key) + f".tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(value)
        os.replace(tmp, self._file(key))

    def get(self, key):
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                with open(self._file(key), "rb") as f:
                    return f.read()
            except FileNotFoundError:
                if time.monotonic() > deadline:
                    raise TimeoutError(Result.ERROR_TIMEOUT, f"key {key!r} did not appear in {self.path}") from None
                time.sleep(0.01)


def get_unique_id():
    """Creates an id on this rank (and starts the store it leads to): 128 bytes to share."""
    uid = _raw.hccn_unique_id()
    _check(lib.hccn_get_unique_id(byref(uid)))
    return bytes(uid.internal)


def _init_rank(rank, world_size, unique_id):
    if len(unique_id) != _raw.UNIQUE_ID_BYTES:
        raise _invalid(f"unique_id must be {_raw.UNIQUE_ID_BYTES} bytes, got {len(unique_id)}")
    uid = _raw.hccn_unique_id()
    ctypes.memmove(uid.internal, unique_id, _raw.UNIQUE_ID_BYTES)
    out = c_void_p()
    _check(lib.hccn_comm_init_rank(byref(out), world_size, byref(uid), rank))
    return Group(out.value)


def _exchange_unique_id(store, rank, key):
    if rank == 0:
        uid = get_unique_id()
        store.set(key, uid)
        return uid
    value = store.get(key)
    return bytes(value) if not isinstance(value, bytes) else value


# ---------------------------------------------------------------------------------------------
# The world and module-level functions

_world = None
_init_count = 0


def init(rank=None, world_size=None, store=None, unique_id=None):
    """Joins the world communicator and returns it as a :class:`Group`.

    - ``init()``: from the environment of the launcher that started the process
      (``hccn_init_from_env``: hccnrun, srun, mpirun, torchrun, msrun ...; docs/launchers.md).
    - ``init(rank=, world_size=, unique_id=)``: with 128 bytes from :func:`get_unique_id`.
    - ``init(rank=, world_size=, store=)``: rank 0 makes the id and ``store.set``s it, the others
      ``store.get`` it. ``store`` is any object with those two methods (a
      ``torch.distributed.TCPStore``, a :class:`FileStore`) or a directory path for a FileStore.
    """
    global _world, _init_count
    if _world is not None:
        raise _invalid("hccn.init() was already called; call hccn.finalize() first")
    if rank is None and world_size is None:
        out = c_void_p()
        _check(lib.hccn_init_from_env(byref(out)))
        _world = Group(out.value)
        return _world
    if rank is None or world_size is None:
        raise _invalid("pass both rank and world_size (or neither, under hccnrun)")
    if unique_id is None:
        if store is None:
            raise _invalid("init(rank=, world_size=) needs store= or unique_id=")
        if isinstance(store, str):
            store = FileStore(store)
        _init_count += 1
        unique_id = _exchange_unique_id(store, rank, f"hccn_unique_id_{_init_count}")
    _world = _init_rank(int(rank), int(world_size), unique_id)
    return _world


def _adopt_world(group):
    """Makes ``group`` the world of the module functions (used by hccn.torch)."""
    global _world
    if _world is None or _world._h is None:
        _world = group
    return _world


def is_initialized():
    return _world is not None


def world():
    if _world is None:
        raise _invalid("hccn is not initialized; call hccn.init() first")
    return _world


def finalize():
    """Destroys the world communicator (queued operations finish first)."""
    global _world
    if _world is not None:
        w, _world = _world, None
        w.destroy()


def _group(group):
    return world() if group is None else group


def get_rank(group=None):
    return _group(group).rank


def get_world_size(group=None):
    return _group(group).size


def allreduce(x, op=ReduceOp.SUM, group=None, async_op=False, compress_dtype=None):
    """In place: ``x`` becomes the reduction over all ranks. ``compress_dtype`` ("fp16"/"bf16")
    sends FP32 data as that type on the wire. Returns None, or a :class:`Future` if async_op."""
    return _group(group).allreduce(x, op=op, async_op=async_op, compress_dtype=compress_dtype)


def allgather(x, out=None, group=None, async_op=False):
    """Returns ``out`` (allocated when None) holding every rank's ``x`` in rank order."""
    return _group(group).allgather(x, out=out, async_op=async_op)


def broadcast(x, src=0, group=None, async_op=False):
    """In place: ``x`` becomes rank ``src``'s ``x``."""
    return _group(group).broadcast(x, src=src, async_op=async_op)


def reduce_scatter(x, out=None, op=ReduceOp.SUM, group=None, async_op=False):
    return _group(group).reduce_scatter(x, out=out, op=op, async_op=async_op)


def alltoall(x, out=None, group=None, async_op=False):
    return _group(group).alltoall(x, out=out, async_op=async_op)


def send(x, dst, group=None, async_op=False):
    return _group(group).send(x, dst, async_op=async_op)


def recv(x, src, group=None, async_op=False):
    return _group(group).recv(x, src, async_op=async_op)


def barrier(group=None, async_op=False):
    return _group(group).barrier(async_op=async_op)


def new_group(ranks, group=None):
    """A sub-group of world ranks ``ranks``; ``None`` on ranks not listed."""
    return _group(group).new_group(ranks)
