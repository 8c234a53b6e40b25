"""torchft over hccn: fault-tolerant training whose replica groups talk through hccn.

    from hccn.torchft import ProcessGroupHccn
    from torchft import Manager, DistributedDataParallel, Optimizer

    pg = ProcessGroupHccn(timeout=timedelta(seconds=10))
    manager = Manager(pg=pg, min_replica_size=1, load_state_dict=..., state_dict=...)
    model = DistributedDataParallel(manager, model)
    optimizer = Optimizer(manager, optimizer)

torchft (PyPI ``torchft``, pinned at 0.2.0, see ``TORCHFT_VERSION``) keeps training going when a
replica group dies: its Lighthouse computes a quorum every step, each replica group's Manager
calls ``configure`` on its process group whenever the quorum changes, and a replica that comes
back heals from a live one. :class:`ProcessGroupHccn` is that process group on hccn, on the
route torchft's own ``ProcessGroupGloo`` takes (``ProcessGroupWrapper._create_pg`` over torch's
store at the address ``configure`` gives): each configuration is a new hccn communicator made
from a unique id that the new group's rank 0 publishes in that store, under hccn's
``torch.distributed`` backend (``hccn._torch_C.ProcessGroupHCCN``). ``HCCN_BACKEND=hccl`` makes
the same class move its data with HCCL.

What hccn adds to torchft:

- **A lost replica is an error within hccn's detection time**, whatever the process group's
  timeout: a killed one in milliseconds (its sockets close), a frozen one (SIGSTOP, a hung host,
  a debugger's stop) after ``HCCN_DEAD_AFTER_MS`` (800 ms) of silence, where Gloo waits for its
  timeout (60 s by default). A replica that is alive but never enters the collective (stuck in
  user code) can only be told from a slow one by time: its peers' waits end at the group's
  timeout (``timeout`` / :meth:`ProcessGroupHccn.set_timeout`), which aborts the communicator.
- **Failures torchft 0.2.0 survives.** A collective of a failed group does not raise from
  ``wait()``: it returns False (c10d's "the work was aborted"), its future carries the error and
  :meth:`ProcessGroupHccn.errored` reports it, so the Manager discards the step. torchft 0.2.0's
  ``_ManagedWork.wait`` skips building its future chain when the process group's ``wait()``
  raises, and its ``DistributedDataParallel`` then fails ``assert fut._fut``: the *surviving*
  replica crashes (with torchft's Gloo group it does). Sends and receives still raise (torchft's
  ``PGTransport`` must not load a state it did not receive). A second 0.2.0 defect remains with
  any process group: once a step has failed, the Manager answers the next buckets' allreduces
  with a ``_DummyWork`` whose future has no ``_fut``, and torchft's DDP crashes on a model with
  more than one gradient bucket; :class:`DistributedDataParallel` here fixes both for any group.
"""

import datetime
import importlib.metadata
import threading

TORCHFT_VERSION = "0.2.0"


def _check_torchft():
    try:
        found = importlib.metadata.version("torchft")
    except importlib.metadata.PackageNotFoundError:
        raise ImportError(
            f"hccn.torchft needs torchft=={TORCHFT_VERSION}, which is not installed: "
            f"`pip install torchft=={TORCHFT_VERSION}` (scripts/setup-python.sh torch installs it)"
        ) from None
    if found != TORCHFT_VERSION:
        raise ImportError(
            f"hccn.torchft is built for torchft=={TORCHFT_VERSION} (it relies on that version's "
            f"ProcessGroupWrapper and Manager internals), found torchft {found}: "
            f"`pip install torchft=={TORCHFT_VERSION}`"
        )


_check_torchft()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.distributed_c10d as c10d  # noqa: E402
import torchft.ddp  # noqa: E402
from torchft.process_group import ProcessGroupWrapper  # noqa: E402

import hccn as _h  # noqa: E402
import hccn.torch as _ht  # noqa: E402  (loads the extension; under hccnrun joins the replica group's world)
from hccn import _raw  # noqa: E402

__all__ = ["TORCHFT_VERSION", "ProcessGroupHccn", "DistributedDataParallel"]

_UNIQUE_ID_KEY = "hccn_unique_id"

# Failures of the group rather than of the call's arguments: the step is lost, the group must be
# configured again.
_GROUP_FAILURES = frozenset(
    {
        _raw.Result.ERROR_TIMEOUT,
        _raw.Result.ERROR_CONNECT,
        _raw.Result.ERROR_TRANSFER,
        _raw.Result.ERROR_BACKEND,
        _raw.Result.ERROR_REMOTE,
        _raw.Result.ERROR_RANK_FAILED,
        _raw.Result.ERROR_REVOKED,
        _raw.Result.ERROR_ABORTED,
        _raw.Result.ERROR_STALE_EPOCH,
        _raw.Result.ERROR_BUSY,
    }
)


def _aborted(what):
    return _ht._exception(_raw.Result.ERROR_ABORTED, f"ProcessGroupHccn: {what}", (), "")


class _Work(dist._Work):
    """A collective's or a transfer's Work as torchft sees it (see the module's doc): a failure
    of the group ends ``wait()`` with False for a collective and is recorded in the group."""

    def __init__(self, group, backend, work, tensors, raises, error=None):
        super().__init__()
        self._group = group
        self._backend = backend
        self._work = work  # None: done already (an operation the backend completed on the caller's thread)
        self._error = error
        self._tensors = tensors
        self._raises = raises

    def wait(self, timeout=None):
        if self._error is None and self._work is not None:
            limit = timeout if timeout else self._group._timeout
            try:
                self._work.wait(limit)
            except Exception as e:  # noqa: BLE001 - every failure is the group's to report
                self._error = self._group._failed(e, self._backend, self._work, limit)
        if self._error is not None:
            if self._raises:
                raise self._error
            return False
        return True

    def get_future(self):
        if self._error is None and self._work is not None:
            return self._work.get_future()
        fut = torch.futures.Future()
        if self._error is not None:
            fut.set_exception(self._error)
        else:
            fut.set_result(self._tensors)
        return fut

    def is_completed(self):
        return self._work is None or self._error is not None or self._work.is_completed()

    def is_success(self):
        return self._error is None and (self._work is None or self._work.is_success())

    def exception(self):
        return self._error if self._error is not None else (self._work.exception() if self._work else None)

    def result(self):
        return self._tensors

    def synchronize(self):
        pass

    def block_current_stream(self):
        pass


class ProcessGroupHccn(ProcessGroupWrapper):
    """torchft's reconfigurable process group on hccn (see the module's doc).

    ``timeout`` bounds the store client of each configuration and every wait for an operation;
    a wait that reaches it aborts the communicator (the operation and those queued after it fail,
    and the group reports the timeout until it is configured again). :meth:`set_timeout` changes
    it for what follows.
    """

    def __init__(self, timeout=datetime.timedelta(seconds=60.0)):
        super().__init__(timeout=timeout)
        self._lock = threading.Lock()
        self._backend = None  # the current configuration's hccn._torch_C.ProcessGroupHCCN
        self._errored = None
        self._inflight = []  # operations issued on it that may not have completed
        self._store = None  # ((host, port), TCPStore client) of the last configuration

    def getBackendName(self):
        return "torchft-hccn"

    # -- configuration ----------------------------------------------------------------------

    def configure(
        self,
        store_addr,
        replica_id,
        rank,
        world_size,
        quorum_id=None,
        group_rank=None,
        group_world_size=None,
        global_ranks=None,
    ):
        """A new communicator of `world_size` for the quorum `quorum_id`, through the store at
        `store_addr` (``host:port/prefix``, unique per configuration); the previous one is closed
        first: shut down when nothing is in flight on it (its peers see a goodbye, not a
        failure), else aborted."""
        self._replica_id, self._quorum_id, self._rank = replica_id, quorum_id, rank
        self._group_rank, self._group_world_size, self._global_ranks = group_rank, group_world_size, global_ranks
        if self._idle():
            self.shutdown()
        else:
            self.abort(errored=False)
        self._pg = self._create_pg(self._store_client(store_addr), rank, world_size)

    def _store_client(self, store_addr):
        """A PrefixStore on one kept connection per store address. torchft opens a new TCPStore
        client per configuration, and torch's client now and then spends seconds in a name
        lookup while connecting (5 s where no resolver answers); quorum changes keep meeting
        the same store (the first replica's), so the connection is kept while they do."""
        where, _, prefix = store_addr.partition("/")
        host, _, port = where.rpartition(":")
        key = (host.strip("[]"), int(port))
        if self._store is None or self._store[0] != key:
            self._store = None  # the previous store's connection closes here
            client = dist.TCPStore(key[0], key[1], is_master=False, wait_for_workers=False, timeout=self._timeout)
            self._store = (key, client)
        self._store[1].set_timeout(self._timeout)
        return dist.PrefixStore(prefix, self._store[1])

    def _create_pg(self, store, rank, world_size):
        with self._lock:
            self._errored = None
            self._inflight = []
        try:
            if rank == 0:
                uid = _h.get_unique_id()
                store.set(_UNIQUE_ID_KEY, uid)
            else:
                uid = bytes(store.get(_UNIQUE_ID_KEY))
        except Exception:
            self._store = None  # a store that failed once is dialled afresh by the next configuration
            raise
        backend = _ht._C.ProcessGroupHCCN.init_rank(uid, rank, world_size, self._timeout)
        # The group needs a store object but never uses it after this point: an in-memory one, so
        # that nothing of the quorum's store outlives the configuration.
        pg = dist.ProcessGroup(dist.HashStore(), rank, world_size)
        pg._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
        pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.CUSTOM, backend)
        with self._lock:
            self._backend = backend
        return pg

    def _idle(self):
        with self._lock:
            return all(w.is_completed() for w in self._inflight)

    def abort(self, errored=True):
        """Ends every operation in flight at once (they fail; their waits return False) and frees
        the communicator. With ``errored`` (torchft's call after a failure) the group reports the
        abort until it is configured again."""
        with self._lock:
            if errored and self._errored is None:
                self._errored = _aborted("the process group was aborted")
            self._backend = None
            self._inflight = []
        super().abort(errored=errored)

    def shutdown(self):
        """Waits for the operations queued, then frees the communicator."""
        with self._lock:
            self._backend = None
            self._inflight = []
        pg, self._pg = self._pg, None
        if pg is not None:
            pg.shutdown()

    def errored(self):
        """The failure that broke the current configuration, or None: an operation's or an
        abort's. A member lost while no operation needed it is not one: the Manager then commits
        the step it completed, and the Lighthouse's next quorum goes on without that member
        (whose peers, having moved on to the next quorum, would look lost too)."""
        with self._lock:
            return self._errored

    # -- operations ---------------------------------------------------------------------------

    def _failed(self, error, backend, work, limit):
        """Records `error` of an operation on `backend`; a wait that ran out of time aborts the
        communicator, so that the operation and those after it end now."""
        if work is not None and not work.is_completed():
            error = _ht._exception(
                _raw.Result.ERROR_TIMEOUT,
                f"ProcessGroupHccn: an operation did not complete within {limit} (the group's timeout); "
                "the communicator was aborted",
                (),
                "",
            )
            backend.abort()
        with self._lock:
            if self._backend is backend and self._errored is None:
                self._errored = error
        return error

    def _run(self, op, tensors, raises=False):
        """Issues `op(parent)`; a failure of the group is a failed Work (see the module's doc)."""
        with self._lock:
            backend, error = self._backend, self._errored
        pg = self._pg
        if pg is None or backend is None:
            error = error or _aborted("the process group is not configured (aborted, or its configuration failed)")
        if error is not None and not raises:
            return _Work(self, backend, None, tensors, raises, error)
        if error is not None:
            raise error
        try:
            work = op(pg)
        except _h.HccnError as e:
            # A failure of the group, or of a configuration closed meanwhile by another thread.
            if raises or (e.code not in _GROUP_FAILURES and backend is self._backend):
                raise
            return _Work(self, backend, None, tensors, raises, self._failed(e, backend, None, None))
        if work is not None:
            with self._lock:
                if len(self._inflight) >= 16:
                    self._inflight = [w for w in self._inflight if not w.is_completed()]
                self._inflight.append(work)
        return _Work(self, backend, work, tensors, raises)

    def allreduce(self, tensors, opts):
        return self._run(lambda pg: pg.allreduce(tensors, opts), tensors)

    def allreduce_coalesced(self, tensors, opts):
        return self._run(lambda pg: pg.allreduce_coalesced(tensors, opts), tensors)

    def allgather(self, output_tensors, input_tensor, opts):
        return self._run(lambda pg: pg.allgather(output_tensors, input_tensor, opts), output_tensors)

    def allgather_into_tensor_coalesced(self, output_tensors, input_tensors, opts):
        return self._run(lambda pg: pg.allgather_into_tensor_coalesced(output_tensors, input_tensors, opts), output_tensors)

    def broadcast(self, tensor_list, opts):
        return self._run(lambda pg: pg.broadcast(tensor_list, opts), tensor_list)

    def barrier(self, opts=None):
        opts = opts if opts is not None else c10d.BarrierOptions()
        return self._run(lambda pg: pg.barrier(opts), [])

    def alltoall_base(self, output_buffer, input_buffer, output_split_sizes, input_split_sizes, opts):
        return self._run(
            lambda pg: pg.alltoall_base(output_buffer, input_buffer, output_split_sizes, input_split_sizes, opts),
            [output_buffer],
        )

    def reduce_scatter(self, output_tensors, input_tensors, opts):
        return self._run(lambda pg: pg.reduce_scatter(output_tensors, input_tensors, opts), output_tensors)

    def reduce_scatter_tensor_coalesced(self, output_tensors, input_tensors, opts):
        return self._run(lambda pg: pg.reduce_scatter_tensor_coalesced(output_tensors, input_tensors, opts), output_tensors)

    def send(self, tensors, dst_rank, tag):
        return self._run(lambda pg: pg.send(tensors, dst_rank, tag), tensors, raises=True)

    def recv(self, tensors, src_rank, tag):
        return self._run(lambda pg: pg.recv(tensors, src_rank, tag), tensors, raises=True)


class DistributedDataParallel(torchft.ddp.DistributedDataParallel):
    """torchft's ``DistributedDataParallel`` with a gradient hook that survives a failed step on
    any process group (torchft 0.2.0's crashes the surviving replica, see the module's doc): a
    bucket whose allreduce failed gets its tensor back, the Manager has recorded the error and
    discards the step."""

    @staticmethod
    def _comm_hook(state, bucket):
        work = state.allreduce(bucket.buffer())
        work.wait()
        fut = work.get_future()
        if not hasattr(fut, "_fut"):
            return fut  # the Manager's _DummyWork after an earlier failure: the tensor, done
        if fut._fut is None:
            work.synchronize()  # builds the chain the failed wait skipped; its errors are swallowed
        return fut._fut
