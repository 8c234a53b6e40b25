"""hccn collectives as TensorFlow ops.

    import tensorflow as tf
    import hccn_tf

    hccn_tf.init()                                   # the job hccnrun started
    # or hccn_tf.init(timeout_seconds=600): how long a collective waits for the other ranks
    g = hccn_tf.allreduce(tf.constant([1.0, 2.0]), op="average")
    rows = hccn_tf.allgather(tf.ones([hccn_tf.rank() + 1, 3]))
    w = hccn_tf.broadcast(w, root_rank=0)

The ops (HccnAllreduce, HccnAllgather, HccnBroadcast) live in _hccn_tf_ops.so, built by
bindings/tensorflow/build.sh against this TensorFlow and loaded with tf.load_op_library. They run
on CPU tensors, eagerly or inside tf.function, and have gradients (allreduce: allreduce of the
gradient; allgather: the rank's slice of the summed gradient; broadcast: the summed gradient on
the root, zeros elsewhere).

Every rank must issue the same collectives in the same order. Eagerly that is program order.
Inside a tf.function, ops without a data dependency could run in any order, so each hccn op
created in a graph gets a control dependency on the previous one in that graph: the order in
which the Python code creates them is the order in which they run, on every rank.

``hccn_tf.keras`` is Horovod's Keras API over these ops: ``DistributedOptimizer`` and the
callbacks ``BroadcastGlobalVariablesCallback`` and ``MetricAverageCallback``, for ``model.fit``.
"""

import atexit
import ctypes
import hashlib
import os
import socket
import threading
import weakref

import tensorflow as tf

__all__ = [
    "HccnError",
    "init",
    "shutdown",
    "rank",
    "size",
    "local_rank",
    "local_size",
    "allreduce",
    "grouped_allreduce",
    "allgather",
    "broadcast",
    "broadcast_variables",
    "average_gradients",
]

_LIB_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_hccn_tf_ops.so")
_ops = tf.load_op_library(_LIB_PATH)
# The same shared object, for the plain C helpers (dlopen hands back the loaded copy).
_c = ctypes.CDLL(_LIB_PATH)
_c.hccn_tf_init.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
_c.hccn_tf_init.restype = ctypes.c_int
_c.hccn_tf_rank.restype = ctypes.c_int
_c.hccn_tf_size.restype = ctypes.c_int
_c.hccn_tf_shutdown.restype = None

_REDUCE_OPS = ("sum", "prod", "max", "min", "average")
_init_lock = threading.Lock()
_initialised = False
_local = (0, 1)  # this process's rank among the ranks of its host, and their number


class HccnError(RuntimeError):
    """An hccn call failed: `code` is the hccn_result, the message hccn_get_last_error()."""

    def __init__(self, code, message):
        super().__init__(f"hccn error {code}: {message}")
        self.code = code


def init(timeout_seconds=None):
    """Joins the job its launcher started (hccn_init_from_env: hccnrun, srun, mpirun, torchrun,
    ...; docs/launchers.md); later calls do nothing.

    `timeout_seconds` (as in tf.distribute's CommunicationOptions) is how long a collective, and
    joining the job, may wait for the other ranks before failing with DeadlineExceededError;
    None keeps HCCN_TIMEOUT_MS (30 s unless set). It applies from the call that joins, so pass
    it to the first init(), before any other hccn_tf call.
    """
    global _initialised, _local
    with _init_lock:
        if _initialised:
            return
        err = ctypes.create_string_buffer(1024)
        with _timeout_ms(timeout_seconds):
            code = _c.hccn_tf_init(err, len(err))
        if code != 0:
            raise HccnError(code, err.value.decode(errors="replace"))
        with tf.init_scope():  # eager even when the first call comes from a tf.function
            _local = _local_rank_and_size(_c.hccn_tf_rank())
        _initialised = True
        atexit.register(shutdown)


# runtime/src/config.rs MAX_TIMEOUT_MS: the largest HCCN_TIMEOUT_MS.
_MAX_TIMEOUT_MS = 7 * 24 * 3600 * 1000


class _timeout_ms:
    """Sets HCCN_TIMEOUT_MS, the knob the library reads when it joins, for the join only."""

    def __init__(self, seconds):
        if seconds is not None and not float(seconds) > 0:
            raise ValueError(f"timeout_seconds must be positive, not {seconds!r}")
        # At most HCCN_TIMEOUT_MS's bound (7 days).
        ms = None if seconds is None else round(float(seconds) * 1000)
        self.ms = None if ms is None else str(min(_MAX_TIMEOUT_MS, max(1, ms)))

    def __enter__(self):
        self.saved = os.environ.get("HCCN_TIMEOUT_MS")
        if self.ms is not None:
            os.environ["HCCN_TIMEOUT_MS"] = self.ms

    def __exit__(self, *exc):
        if self.ms is None:
            return
        if self.saved is None:
            del os.environ["HCCN_TIMEOUT_MS"]
        else:
            os.environ["HCCN_TIMEOUT_MS"] = self.saved


def _host_identity():
    """32 bytes naming this host as hccn does: boot id, host name, network, mount and IPC
    namespaces (two namespace "hosts" on one machine are two hosts)."""
    h = hashlib.sha256()
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            h.update(f.read())
    except OSError:
        pass
    h.update(socket.gethostname().encode())
    for ns in ("net", "mnt", "ipc"):
        try:
            h.update(os.stat(f"/proc/self/ns/{ns}").st_ino.to_bytes(8, "little"))
        except OSError:
            pass
    return h.digest()


def _local_rank_and_size(my_rank):
    """Every rank's host identity, gathered (one allgather when joining): the ranks before this
    one on its host, and how many ranks it has."""
    mine = tf.constant([list(_host_identity())], dtype=tf.uint8)
    hosts = [bytes(row) for row in _ops.hccn_allgather(mine).numpy()]
    return hosts[:my_rank].count(hosts[my_rank]), hosts.count(hosts[my_rank])


def shutdown():
    """Waits for queued collectives and frees the communicator."""
    global _initialised
    with _init_lock:
        if _initialised:
            _c.hccn_tf_shutdown()
            _initialised = False


def rank():
    init()
    return _c.hccn_tf_rank()


def size():
    init()
    return _c.hccn_tf_size()


def local_rank():
    """This process's rank among the ranks on its host (0 .. local_size() - 1)."""
    init()
    return _local[0]


def local_size():
    """The number of ranks on this process's host."""
    init()
    return _local[1]


# Graph mode: the last hccn op created in each graph, to chain the next one after it.
_last_op = weakref.WeakKeyDictionary()


def _ordered(make):
    """Creates an op with `make()`, after the previous hccn op of the same graph."""
    init()
    if tf.executing_eagerly():
        return make()
    graph = tf.compat.v1.get_default_graph()
    prev = _last_op.get(graph)
    if prev is None:
        out = make()
    else:
        with tf.control_dependencies([prev]):
            out = make()
    _last_op[graph] = out.op
    return out


def allreduce(tensor, op="sum", name=None):
    """Elementwise `op` ("sum", "prod", "max", "min", "average") of `tensor` over all ranks."""
    if op not in _REDUCE_OPS:
        raise ValueError(f"op must be one of {_REDUCE_OPS}, not {op!r}")
    tensor = tf.convert_to_tensor(tensor)
    return _ordered(lambda: _ops.hccn_allreduce(tensor, reduce_op=op, name=name))


def grouped_allreduce(tensors, op="sum"):
    """Allreduces each tensor of the list, in list order (None entries are passed through)."""
    return [None if t is None else allreduce(t, op=op) for t in tensors]


def allgather(tensor, name=None):
    """Every rank's `tensor` concatenated along the first dimension (which may differ by rank)."""
    tensor = tf.convert_to_tensor(tensor)
    return _ordered(lambda: _ops.hccn_allgather(tensor, name=name))


def broadcast(tensor, root_rank=0, name=None):
    """`root_rank`'s `tensor` on every rank."""
    tensor = tf.convert_to_tensor(tensor)
    return _ordered(lambda: _ops.hccn_broadcast(tensor, root_rank=int(root_rank), name=name))


def broadcast_variables(variables, root_rank=0):
    """Assigns `root_rank`'s value to each variable, in list order (start of training)."""
    for v in variables:
        v.assign(broadcast(v, root_rank=root_rank))


def average_gradients(grads):
    """Averages a list of gradients over the ranks (data parallelism); None stays None.

    IndexedSlices (from embedding lookups) are densified first.
    """
    out = []
    for g in grads:
        if isinstance(g, tf.IndexedSlices):
            g = tf.convert_to_tensor(g)
        out.append(None if g is None else allreduce(g, op="average"))
    return out


@tf.RegisterGradient("HccnAllreduce")
def _allreduce_grad(op, grad):
    reduce_op = op.get_attr("reduce_op")
    if isinstance(reduce_op, bytes):
        reduce_op = reduce_op.decode()
    if reduce_op not in ("sum", "average"):
        # As in Horovod: only sum and average have the allreduce of the gradients as gradient.
        raise ValueError(
            f"hccn_tf.allreduce with op={reduce_op!r} has no gradient; use op='sum' or 'average' "
            "on trainable paths, or tf.stop_gradient"
        )
    return allreduce(grad, op=reduce_op)


@tf.RegisterGradient("HccnAllgather")
def _allgather_grad(op, grad):
    summed = allreduce(grad, op="sum")
    rows = tf.shape(op.inputs[0])[0:1]
    all_rows = allgather(rows)
    r = rank()
    start = tf.reduce_sum(all_rows[:r])
    return summed[start : start + all_rows[r]]


@tf.RegisterGradient("HccnBroadcast")
def _broadcast_grad(op, grad):
    summed = allreduce(grad, op="sum")
    if rank() == op.get_attr("root_rank"):
        return summed
    return tf.zeros_like(summed)
