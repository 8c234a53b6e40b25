"""The ``"hccn"`` backend of torch.distributed (CPU tensors), and training that survives a lost rank.

    import hccn.torch                       # registers the backend
    import torch.distributed as dist
    dist.init_process_group("hccn")         # torchrun-style variables, or under hccnrun

The backend is a C++ ``c10d::Backend`` (the extension ``hccn._torch_C``, built by
``bindings/python/build_torch_ext.py`` against the installed torch) that calls libhccn through
its C ABI: operations the caller waits for at once run on the caller's thread, the others are
queued on hccn's stream and their ``Work`` and future complete from it (no thread per
operation). See bindings/python/csrc/backend.h.

Rendezvous:

- **torchrun style** (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``): torch opens its
  store before any backend exists and hands it to the backend, which uses it for one thing only,
  as NCCL does: group rank 0 calls ``hccn_get_unique_id`` and publishes the 128 bytes under the
  group's prefix; the others read them and call ``hccn_comm_init_rank``.
- **under hccnrun, srun, mpirun or msrun** (no torchrun variables: whatever ``hccn_init_from_env``
  finds, docs/launchers.md): importing this module joins the world; rank 0 opens a torch
  TCPStore on a free port of ``MASTER_ADDR`` (``127.0.0.1`` unless set: set it to rank 0's host
  when ranks span hosts) and tells the others the port over hccn; ``MASTER_ADDR``,
  ``MASTER_PORT``, ``RANK`` and ``WORLD_SIZE`` are exported so that ``init_process_group("hccn")``
  needs no arguments, and the default group uses that world communicator.

Sub-groups of an hccn default group (``dist.new_group``, ``dist.split_group``) come from
``hccn_new_group`` on the world communicator. DDP's gradient buckets are allocated in hccn's
shareable memory (this module sets ``DDP_DISABLE_COMM_MEM=0`` unless it is set; ``1`` turns it
off), which halves the CPU time of DDP's allreduces between ranks of one host. Errors are raised as hccn's error classes for their
code (``hccn.RankFailedError`` ...) that are also ``torch.distributed.DistBackendError``; the
failed ranks are in ``.failed_ranks``. Inside ``loss.backward()`` under DDP torch converts the
error itself: it arrives as a ``DistBackendError`` with the same text.

Elastic training: after a failure the survivors call :func:`shrink` (continue without the lost
ranks) or :func:`rebuild` (also admit the replacements that ``hccnrun --elastic`` starts); both
agree on the survivors through hccn, in band, and make the new communicator torch's default
group. examples/pytorch/elastic_ddp.py shows the whole cycle.
"""

import datetime
import importlib.util
import json
import os
import sysconfig
from ctypes import byref, c_uint64

try:
    import torch
except ImportError as e:  # say which torch the backend next to this package is for
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_torch_C.json")) as f:
            _wanted = "==" + json.load(f)["torch"]
    except (OSError, ValueError, KeyError):
        _wanted = ""
    raise ImportError(f"hccn.torch needs torch{_wanted} (pip install 'torch{_wanted}'): {e}") from e
import torch.distributed as dist

import hccn as _h
from hccn import _raw

__all__ = [
    "BACKEND",
    "ProcessGroupHCCN",
    "HccnTorchError",
    "shrink",
    "rebuild",
    "failed_ranks",
    "is_replacement",
    "backend_of",
]

BACKEND = "hccn"


# ---------------------------------------------------------------------------------------------
# The extension

def _load_extension():
    """``hccn._torch_C`` from next to this package (the wheel's, or one built with
    ``build_torch_ext.py --install``), else from the source tree's target/torch-ext; refused with
    what to do when it was built for another torch (its ``_torch_C.json``)."""
    name = "_torch_C" + sysconfig.get_config_var("EXT_SUFFIX")
    here = os.path.dirname(os.path.abspath(__file__))
    tried = []
    for path in (
        os.path.join(here, name),
        os.path.normpath(os.path.join(here, "..", "..", "..", "target", "torch-ext", "hccn", name)),
    ):
        if not os.path.exists(path):
            tried.append(f"{path} (missing)")
            continue
        _check_pairing(os.path.join(os.path.dirname(path), "_torch_C.json"))
        spec = importlib.util.spec_from_file_location("hccn._torch_C", path)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except ImportError as e:
            tried.append(f"{path} ({e})")
            continue
        return module
    raise ImportError(
        f"hccn.torch: this hccn {_h.__version__} has no torch backend for this Python and torch "
        f"{torch.__version__} (tried " + "; ".join(tried) + "). Install the hccn wheel that carries it "
        "(hccn-VERSION-cpXY-cpXY-manylinux_*.whl, from `scripts/release.sh --wheel` on a machine with "
        "the torch it pins), or build it for this torch from the hccn source tree: "
        "`python bindings/python/build_torch_ext.py --install`."
    )


def _check_pairing(path):
    """Refuses a backend built for another torch, naming both versions (the C++ ABI would fail
    later, with an undefined symbol or a crash)."""
    try:
        with open(path) as f:
            built = json.load(f)
    except (OSError, ValueError):
        return  # a build older than the pairing file: loading it tells
    have = {"torch": torch.__version__.split("+")[0], "cxx11_abi": bool(torch.compiled_with_cxx11_abi())}
    wrong = [k for k in have if k in built and built[k] != have[k]]
    if wrong:
        raise ImportError(
            f"hccn.torch: hccn {_h.__version__}'s torch backend was built for torch {built.get('torch')} "
            f"(C++11 ABI {built.get('cxx11_abi')}), but this Python has torch {torch.__version__} "
            f"(C++11 ABI {have['cxx11_abi']}). Install torch=={built.get('torch')} (pip install "
            "'hccn-...whl[torch]' does), or build the backend for this torch from the hccn source "
            "tree: `python bindings/python/build_torch_ext.py --install`."
        )


_C = _load_extension()
_C.load_library(_raw.lib._handle)
ProcessGroupHCCN = _C.ProcessGroupHCCN  # the c10d::Backend subclass


# ---------------------------------------------------------------------------------------------
# Errors

class HccnTorchError(_h.HccnError, dist.DistBackendError):
    """An hccn failure in torch.distributed: ``code``, ``message`` and ``failed_ranks``."""

    failed_ranks = ()


_error_classes = {}


def _error_class(code):
    base = _h._ERRORS.get(code, _h.HccnError)
    cls = _error_classes.get(base)
    if cls is None:
        cls = HccnTorchError if base is _h.HccnError else type(base.__name__, (base, HccnTorchError), {})
        cls.__module__ = __name__
        _error_classes[base] = cls
    return cls


def _exception(code, message, failed, text):
    """Called by the extension for every hccn error that crosses into Python."""
    if failed:
        message = f"{message} [failed ranks: {' '.join(str(r) for r in failed)}]"
    e = _error_class(code)(code, message)
    e.failed_ranks = tuple(failed)
    return e


_C.set_exception_factory(_exception)


# ---------------------------------------------------------------------------------------------
# Creation

class _State:
    adopt = None  # a backend made by shrink/rebuild, for the next default group
    hccnrun_store = None  # the TCPStore this process hosts for torch under hccnrun
    joined_epoch = None  # the epoch of the world this process joined under hccnrun


def _unique_id_via(store, rank):
    key = "hccn_unique_id"
    if rank == 0:
        uid = _h.get_unique_id()
        store.set(key, uid)
        return uid
    return bytes(store.get(key))


def _timeout(opts):
    t = opts.timeout
    return t if isinstance(t, datetime.timedelta) else datetime.timedelta(seconds=float(t))


def _given_timeout(timeout):
    """The timeout the caller gave init_process_group (None: torch's default, which leaves
    hccn's own, HCCN_TIMEOUT_MS)."""
    return None if timeout == dist.default_pg_timeout else timeout


# runtime/src/config.rs MAX_TIMEOUT_MS: the largest HCCN_TIMEOUT_MS.
_MAX_TIMEOUT_MS = 7 * 24 * 3600 * 1000


class _deadline:
    """While a communicator is made: its waits (joining, then every operation's) are bounded by
    `timeout` instead of HCCN_TIMEOUT_MS, the knob the library reads then (None: unchanged)."""

    def __init__(self, timeout):
        # At most HCCN_TIMEOUT_MS's bound (7 days): torch allows longer, which hccn refuses.
        ms = None if timeout is None else round(timeout.total_seconds() * 1000)
        self.ms = None if ms is None else str(min(_MAX_TIMEOUT_MS, max(1, ms)))

    def __enter__(self):
        self.saved = os.environ.get("HCCN_TIMEOUT_MS")
        if self.ms is not None:
            os.environ["HCCN_TIMEOUT_MS"] = self.ms

    def __exit__(self, *exc):
        if self.ms is not None:
            if self.saved is None:
                del os.environ["HCCN_TIMEOUT_MS"]
            else:
                os.environ["HCCN_TIMEOUT_MS"] = self.saved


def _init_rank(opts, rank, size, timeout):
    """A communicator of its own for the group, through torch's store, with the group's timeout."""
    with _deadline(_given_timeout(timeout)):
        return _C.ProcessGroupHCCN.init_rank(_unique_id_via(opts.store, rank), rank, size, timeout)


def _create(opts, backend_options=None):
    rank, size, timeout = opts.group_rank, opts.group_size, _timeout(opts)
    ranks = list(opts.global_ranks_in_group)
    if not ranks:  # the default group
        adopt, _State.adopt = _State.adopt, None
        world = _h._world
        joined = world is not None and world._h is not None and (world.rank, world.size) == (rank, size)
        if adopt is not None and (adopt.rank(), adopt.size()) == (rank, size):
            b = adopt
        elif joined and _given_timeout(timeout) is None:
            b = _C.ProcessGroupHCCN.borrow(world.handle.value, timeout)
        else:
            # A timeout given to init_process_group under hccnrun cannot reach the world joined at
            # import (its waits have HCCN_TIMEOUT_MS's bound): the group gets its own communicator.
            b = _init_rank(opts, rank, size, timeout)
        return b
    parent = _hccn_default_group()
    if parent is not None:  # global ranks are the default group's ranks; its deadline too
        return parent.new_group(ranks)
    # The default group is another backend's: a communicator of its own, through torch's store.
    return _init_rank(opts, rank, size, timeout)


def _hccn_default_group():
    """The default group's backend when it is hccn's, else None."""
    if not dist.is_initialized():
        return None
    try:
        return backend_of(None)
    except (RuntimeError, ValueError):
        return None


def backend_of(group=None):
    """The C++ backend (``hccn._torch_C.ProcessGroupHCCN``) of ``group`` (default: the default group)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    b = pg._get_backend(torch.device("cpu"))
    if not isinstance(b, _C.ProcessGroupHCCN):
        raise ValueError(f"hccn.torch: {pg} is not an hccn process group")
    return b


def failed_ranks(group=None):
    """The members of ``group`` that hccn has seen fail (group ranks, ascending)."""
    return list(backend_of(group).failed_ranks())


# ---------------------------------------------------------------------------------------------
# Under hccnrun

def _torchrun_env_missing():
    return any(k not in os.environ for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"))


def _under_hccnrun():
    """hccnrun exports torchrun's variables too; its own say where the job's world is."""
    return "HCCN_RANK" in os.environ and "HCCN_STORE" in os.environ


def _host_store(rank, size):
    """Rank 0 opens a torch TCPStore on a free port and returns the port; others return 0."""
    if rank != 0:
        return 0
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    _State.hccnrun_store = dist.TCPStore(addr, 0, size, True, wait_for_workers=False)
    return _State.hccnrun_store.port


def _export(rank, size, port):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(size)
    # Every rank, rank 0 included, is a client of the store that rank 0 already hosts.
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"


def _join_from_hccnrun():
    """Under hccnrun: join the world and export the torchrun variables (see the module doc)."""
    try:
        world = _h.init()
    except _h.InvalidArgumentError:
        return  # not under hccnrun (HCCN_RANK etc. unset): leave it to torch's own checks
    epoch = c_uint64()
    _h._check(_raw.lib.hccn_comm_epoch(world.handle, byref(epoch)))
    _State.joined_epoch = epoch.value
    port = torch.tensor([_host_store(world.rank, world.size)], dtype=torch.int64)
    world.broadcast(port, src=0)  # the same handshake as _install_world's, for replacements
    _export(world.rank, world.size, int(port[0]))


def is_replacement():
    """True in a process that ``hccnrun --elastic`` started to replace a lost rank: it joined a
    running job (its world's epoch was past 0) and must receive the training state."""
    return bool(_State.joined_epoch)


# ---------------------------------------------------------------------------------------------
# Elastic training

def shrink(group=None):
    """Called by every survivor after an hccn error: agrees with the others on who is left
    (``hccn_comm_shrink``, in band: it works when the store's host died too) and makes the
    survivors torch's new default group (dense ranks in old-rank order). Every other group is
    destroyed, as ``dist.shrink_group`` does for the default group. Returns the new group."""
    old = _default_backend(group, "shrink")
    return _install_world(old.shrink_comm())


def rebuild(group=None, timeout=10.0):
    """As :func:`shrink`, then admits the processes waiting to join (the replacements that
    ``hccnrun --elastic`` starts), waiting up to ``timeout`` seconds for a first one when none
    is queued (0: only those already waiting). The replacements take the ranks after the
    survivors. When nothing changed (no rank lost, nobody admitted) the process group stays the
    same object and only its communicator moves to the new epoch. Returns the default group."""
    old = _default_backend(group, "rebuild")
    new = old.rebuild_comm(int(max(0.0, timeout) * 1000))
    if new.size() == old.size() and new.rank() == old.rank() and not old.failed_ranks():
        old.adopt_comm(new)
        _replace_module_world(old)
        return dist.group.WORLD
    return _install_world(new)


def _default_backend(group, what):
    b = backend_of(group)
    if group is not None and group != dist.distributed_c10d._get_default_group():
        raise ValueError(
            f"hccn.torch.{what}: only the default group is rebuilt here; for a sub-group use "
            "torch.distributed.shrink_group, which the hccn backend supports"
        )
    return b


def _replace_module_world(backend):
    """hccn's module functions (hccn.allreduce, ...) follow the default group's new communicator,
    which the backend owns; the old world communicator is freed."""
    if _h._world is not None and _h._world._h is not None and _h._world.handle.value != backend.comm_handle:
        _h.finalize()
    if _h._world is None:
        _h._adopt_world(_h.Group(backend.comm_handle, owned=False))


def _install_world(new):
    """Makes backend ``new`` the default group: rank 0 hosts a fresh torch store and tells the
    others its port over hccn (replacements do the same in _join_from_hccnrun), then torch's
    groups are destroyed and the default group made again over ``new``."""
    port = new.broadcast_value(_host_store(new.rank(), new.size()))
    if dist.is_initialized():
        dist.destroy_process_group()
    _replace_module_world(new)
    _export(new.rank(), new.size(), port)
    _State.adopt = new
    dist.init_process_group(BACKEND, rank=new.rank(), world_size=new.size())
    return dist.group.WORLD


# ---------------------------------------------------------------------------------------------

def _register():
    if BACKEND.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])


_register()
# DDP puts its gradient buckets in the backend's memory (Backend::allocateTensor: hccn's shareable
# memory, which a peer on the host reads with plain loads: half the CPU time of an allreduce that
# must read the peer with process_vm_readv) only when DDP_DISABLE_COMM_MEM is "0"; torch's default
# is "1". A value the user set is kept.
os.environ.setdefault("DDP_DISABLE_COMM_MEM", "0")
if (_under_hccnrun() or _torchrun_env_missing()) and not _h.is_initialized():
    _join_from_hccnrun()
