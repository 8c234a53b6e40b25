"""hccn as MindSpore's collective communication library on CPU.

    import hccn_ms                                   # first, under hccnrun, msrun, srun, mpirun ...
    import mindspore as ms
    from mindspore.communication import init, get_rank, get_group_size
    from mindspore import ops

    init()                                           # MindSpore's own API, now over hccn
    y = ops.AllReduce()(ms.Tensor([1.0, 2.0]))       # ... and its own ops

Importing this package under a launcher (hccnrun, msrun, srun, mpirun, torchrun: whatever
hccn_init_from_env finds, docs/launchers.md) joins the job and makes MindSpore take
the route it takes under Open MPI: it loads libhccn_ms.so, whose soname is
"libmpi_collective.so", so the dlopen of that name in MindSpore's CPU backend returns it, and
MindSpore's `init()`, `create_group()`, communication ops (PyNative and graph mode) and the
data-parallel gradient reducer run over hccn (details: bindings/mindspore/README.md). Under
msrun the world is formed from msrun's variables, and msrun's scheduler process, which hccn does
not need, exits at the import. Without a launcher it changes nothing.

The same library also serves ops.Custom(func_type="aot") cells for what MindSpore's own CPU
kernels refuse (they take float32/float16 sums only, and AllGather/Broadcast on the world group
only): `ReduceScatter(op)`, which has no CPU kernel at all, `AllReduce(op)` with "prod", "max",
"min" or "average" on any dtype, and `AllGather()` / `Broadcast(root)` on any dtype. They work in
both modes, with gradients, on the world communicator; every rank must run them in the same
order (program order in PyNative, data dependencies in a graph).
"""

import atexit
import ctypes
import os
import sys

__all__ = [
    "HccnError",
    "ROUTE_ACTIVE",
    "init",
    "rank",
    "size",
    "last_error",
    "built_for",
    "AllReduce",
    "AllGather",
    "Broadcast",
    "ReduceScatter",
]

LIB_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libhccn_ms.so")
HCCN_ERROR_INVALID_ARGUMENT = 1


class HccnError(RuntimeError):
    """An hccn call failed: `code` is the hccn_result."""

    def __init__(self, code, message):
        super().__init__(f"hccn error {code}: {message}")
        self.code = code


# Loading it registers the soname libmpi_collective.so in this process: MindSpore's later
# dlopen("libmpi_collective.so") returns this library instead of searching its own lib directory.
_c = ctypes.CDLL(LIB_PATH)
for _name in ("hccn_ms_join", "hccn_ms_rank", "hccn_ms_size"):
    getattr(_c, _name).restype = ctypes.c_int
for _name in ("hccn_ms_last_error", "hccn_ms_version_problem", "hccn_ms_built_for"):
    getattr(_c, _name).restype = ctypes.c_char_p
_c.hccn_ms_shutdown.restype = None


def last_error():
    """The message of the last failing hccn call or kernel ("" when none)."""
    return _c.hccn_ms_last_error().decode(errors="replace")


def built_for():
    """The MindSpore version this library was compiled against."""
    return _c.hccn_ms_built_for().decode()


_problem = _c.hccn_ms_version_problem()
if _problem:
    raise ImportError(_problem.decode(errors="replace"))


def _end_msrun_scheduler():
    """msrun runs the script in a scheduler process too (MS_ROLE=MS_SCHED), which waits for its
    workers to register; under hccn they form their world without it, so it ends here, at once
    and successfully (msrun then waits for the workers alone)."""
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        print("hccn_ms: msrun's scheduler process is not needed (hccn forms the world from msrun's "
              "variables); it exits", file=sys.stderr, flush=True)
        sys.exit(0)


def _join():
    """Joins the launcher's job; False when no launcher is found (or its variables are invalid)."""
    global _not_joined
    code = _c.hccn_ms_join()
    if code == 0:
        return True
    if code == HCCN_ERROR_INVALID_ARGUMENT:
        _not_joined = last_error()
        return False
    raise HccnError(code, last_error())


_not_joined = ""


def _take_mpi_route():
    """Makes MindSpore load "libmpi_collective.so" (this library) for its CPU collectives.

    MindSpore (utils/ms_utils.h UseMPI, communication/_comm_helper.py _check_mpi_envs) takes its
    Open MPI route when OMPI_COMMAND and PMIX_RANK are set and MS_ROLE is not; it reads them when
    init() runs, so setting them here, before init(), is enough.
    """
    # Under msrun hccn formed the world from these; MindSpore must not build its own cluster too.
    for var in ("MS_ROLE", "MS_SCHED_HOST", "MS_SCHED_PORT", "MS_WORKER_NUM", "MS_NODE_ID"):
        os.environ.pop(var, None)
    os.environ["OMPI_COMMAND"] = "hccnrun"
    os.environ["PMIX_RANK"] = str(_c.hccn_ms_rank())


_end_msrun_scheduler()
ROUTE_ACTIVE = _join()
if ROUTE_ACTIVE:
    _take_mpi_route()
    # Leave the job while Python shuts down, before C++ static teardown (where MindSpore would
    # otherwise finalize it); MindSpore's own Finalize later is then a no-op.
    atexit.register(_c.hccn_ms_shutdown)

# The cells below need MindSpore itself; imported after the environment is arranged.
import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import nn, ops  # noqa: E402

_REDUCE_OPS = {"sum": "sum", "prod": "prod", "max": "max", "min": "min", "average": "avg", "mean": "avg"}


def init():
    """Checks that this process joined a launcher's job (importing the package joins it)."""
    if not ROUTE_ACTIVE:
        raise HccnError(
            HCCN_ERROR_INVALID_ARGUMENT,
            f"not in a launcher's job ({_not_joined}): launch with hccnrun, msrun, srun or mpirun",
        )


def rank():
    init()
    return _c.hccn_ms_rank()


def size():
    init()
    return _c.hccn_ms_size()


def _custom(func, out_shape, bprop=None):
    op = ops.Custom(
        func=f"{LIB_PATH}:{func}",
        out_shape=out_shape,
        out_dtype=lambda dtype, *rest: dtype,
        func_type="aot",
        bprop=bprop,
    )
    # A collective must run on every rank, once per call, in program order. Marked as having a
    # side effect (as MindSpore's own Barrier is), a graph neither merges two alike nor drops one
    # whose result is unused (two alike and an unused one: 3 collectives with it, 1 without),
    # and orders them. Inside a bprop the mark is not enough (see Broadcast).
    op.add_prim_attr("side_effect_mem", True)
    return op


class AllReduce(nn.Cell):
    """Elementwise `op` ("sum", "prod", "max", "min", "average") over all ranks, any dtype.

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


class ReduceScatter(nn.Cell):
    """`op` over all ranks of inputs of shape (size * d0, ...); rank r gets rows r*d0 .. (r+1)*d0."""

    def __init__(self, op="sum"):
        super().__init__()
        if op not in _REDUCE_OPS:
            raise ValueError(f"op must be one of {sorted(_REDUCE_OPS)}, not {op!r}")
        init()
        n = size()

        def out_shape(shape):
            if not shape or shape[0] % n != 0:
                raise ValueError(f"ReduceScatter: the first dimension of {shape} is not a multiple of {n}")
            return [shape[0] // n] + list(shape[1:])

        self.op = _custom(f"hccn_ms_reduce_scatter_{_REDUCE_OPS[op]}", out_shape)

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
        scale = 1.0 if rank() == int(root) else 0.0
        reduce_grad = _custom("hccn_ms_allreduce_sum", lambda shape: shape)

        def bprop(x, root_t, out, dout):  # noqa: ARG001
            # Every rank must run the collective; graph mode drops it where the result looks
            # unused (zeros_like, even under ops.depend), so the root's 1 and the others' 0 are
            # a product with it.
            return (reduce_grad(dout) * scale, ops.zeros_like(root_t))

        self.op = _custom("hccn_ms_broadcast", lambda shape, root_shape: shape, bprop)

    def construct(self, x):
        return self.op(x, self.root)
