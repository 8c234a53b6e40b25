"""hccn collectives in MindSpore, through ops.Custom(func_type="aot") on CPU.

    import mindspore as ms
    import hccn_ms

    hccn_ms.init()                                  # the job hccnrun started
    allreduce = hccn_ms.AllReduce("sum")            # an nn.Cell, with a gradient
    y = allreduce(ms.Tensor([1.0, 2.0]))
    g = hccn_ms.AllGather()(x)                      # (size * d0, ...), rank order
    w = hccn_ms.Broadcast(root=0)(w)

MindSpore has no public plug-in route for a third-party collective library (the libraries it
loads are fixed in its code, and `mindspore.communication.init` accepts only hccl, nccl and
mccl), so this package is the supported way in: each cell wraps an ops.Custom whose kernel is an
`extern "C"` function of _hccn_ms_aot.so (bindings/mindspore/hccn_ms_aot.cc) that runs the hccn
collective on the host buffers MindSpore hands it.

Every rank must run the same collectives in the same order: use PyNative mode (program order),
or make sure a graph orders them through data dependencies.
"""

import atexit
import ctypes
import os
import threading

import numpy as np
import mindspore as ms
from mindspore import nn, ops

__all__ = [
    "HccnError",
    "init",
    "shutdown",
    "rank",
    "size",
    "last_error",
    "AllReduce",
    "AllGather",
    "Broadcast",
    "broadcast_parameters",
    "GradientAverager",
]

LIB_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_hccn_ms_aot.so")
_c = ctypes.CDLL(LIB_PATH)
for _name in ("hccn_ms_init", "hccn_ms_rank", "hccn_ms_size"):
    getattr(_c, _name).restype = ctypes.c_int
_c.hccn_ms_last_error.restype = ctypes.c_char_p
_c.hccn_ms_shutdown.restype = None

_REDUCE_OPS = {"sum": "sum", "prod": "prod", "max": "max", "min": "min", "average": "avg", "mean": "avg"}
_lock = threading.Lock()
_initialised = False


class HccnError(RuntimeError):
    """An hccn call failed: `code` is the hccn_result."""

    def __init__(self, code, message):
        super().__init__(f"hccn error {code}: {message}")
        self.code = code


def init():
    """Joins the job that hccnrun started (hccn_init_from_env); later calls do nothing."""
    global _initialised
    with _lock:
        if _initialised:
            return
        code = _c.hccn_ms_init()
        if code != 0:
            raise HccnError(code, last_error())
        _initialised = True
        atexit.register(shutdown)


def shutdown():
    global _initialised
    with _lock:
        if _initialised:
            _c.hccn_ms_shutdown()
            _initialised = False


def rank():
    init()
    return _c.hccn_ms_rank()


def size():
    init()
    return _c.hccn_ms_size()


def last_error():
    """The message of the last failing hccn kernel ("" when none)."""
    return _c.hccn_ms_last_error().decode(errors="replace")


def _custom(func, out_shape, bprop=None):
    return ops.Custom(
        func=f"{LIB_PATH}:{func}",
        out_shape=out_shape,
        out_dtype=lambda dtype, *rest: dtype,
        func_type="aot",
        bprop=bprop,
    )


class AllReduce(nn.Cell):
    """Elementwise `op` ("sum", "prod", "max", "min", "average") over all ranks.

    Gradient (sum and average): the same allreduce of the incoming gradient, i.e. the gradient
    of the sum of every rank's loss (Horovod's convention).
    """

    def __init__(self, op="sum"):
        super().__init__()
        if op not in _REDUCE_OPS:
            raise ValueError(f"op must be one of {sorted(_REDUCE_OPS)}, not {op!r}")
        init()
        func = f"hccn_ms_allreduce_{_REDUCE_OPS[op]}"
        bprop = None
        if _REDUCE_OPS[op] in ("sum", "avg"):
            grad_op = _custom(func, lambda shape: shape)

            def bprop(x, out, dout):  # noqa: ARG001 - MindSpore's bprop signature
                return (grad_op(dout),)

        self.op = _custom(func, lambda shape: shape, bprop)

    def construct(self, x):
        return self.op(x)


class AllGather(nn.Cell):
    """Every rank's tensor (all of one shape) concatenated along the first dimension."""

    def __init__(self):
        super().__init__()
        init()
        n = size()
        me = rank()
        reduce_grad = _custom("hccn_ms_allreduce_sum", lambda shape: shape)

        def bprop(x, out, dout):  # noqa: ARG001
            rows = x.shape[0]
            return (reduce_grad(dout)[me * rows : (me + 1) * rows],)

        self.op = _custom("hccn_ms_allgather", lambda shape: [shape[0] * n] + list(shape[1:]), bprop)

    def construct(self, x):
        return self.op(x)


class Broadcast(nn.Cell):
    """`root`'s tensor on every rank (all pass tensors of one shape).

    Gradient: the summed gradient on the root, zeros elsewhere.
    """

    def __init__(self, root=0):
        super().__init__()
        init()
        self.root = ms.Tensor(np.array([int(root)], np.int64))
        is_root = rank() == int(root)
        reduce_grad = _custom("hccn_ms_allreduce_sum", lambda shape: shape)

        def bprop(x, root_t, out, dout):  # noqa: ARG001
            summed = reduce_grad(dout)
            return (summed if is_root else ops.zeros_like(summed), ops.zeros_like(root_t))

        self.op = _custom("hccn_ms_broadcast", lambda shape, root_shape: shape, bprop)

    def construct(self, x):
        return self.op(x, self.root)


def broadcast_parameters(params, root=0):
    """Sets each parameter to `root`'s value, in list order (start of training)."""
    bcast = Broadcast(root)
    for p in params:
        p.set_data(bcast(p.value()))


class GradientAverager(nn.Cell):
    """Averages a tuple of gradients over the ranks, in order (data parallelism)."""

    def __init__(self):
        super().__init__()
        self.allreduce = AllReduce("average")

    def construct(self, grads):
        return tuple(self.allreduce(g) for g in grads)
