"""The raw layer: ctypes declarations that mirror include/hccn.h one to one.

Names, argument types and enum numbers are those of the C header (C ABI v1). Nothing here
checks results; the idiomatic layer in ``hccn/__init__.py`` turns codes into exceptions.
The library is ``$HCCN_LIB`` when that is set, else the package's own ``lib/libhccn.so.1``
(put there by the wheel's build, bindings/python/setup.py), else the system's ``libhccn.so``
(the loader's search, e.g. an install made by scripts/install.sh in a standard place).
"""

import ctypes
import ctypes.util
import enum
import os
from ctypes import POINTER, c_char_p, c_int32, c_uint8, c_uint32, c_uint64, c_void_p

__all__ = [
    "Result",
    "DataType",
    "ReduceOpCode",
    "hccn_unique_id",
    "lib",
    "library_path",
    "UNIQUE_ID_BYTES",
]


class Result(enum.IntEnum):
    """``hccn_result``."""

    SUCCESS = 0
    ERROR_INVALID_ARGUMENT = 1
    ERROR_NULL_POINTER = 2
    ERROR_OUT_OF_MEMORY = 3
    ERROR_INTERNAL = 4
    ERROR_NOT_SUPPORTED = 5
    ERROR_NOT_FOUND = 6
    ERROR_UNAVAILABLE = 7
    ERROR_SYSTEM = 8
    ERROR_TIMEOUT = 9
    ERROR_CONNECT = 11
    ERROR_TRANSFER = 13
    ERROR_BACKEND = 15
    ERROR_REMOTE = 21
    ERROR_RANK_FAILED = 100
    ERROR_REVOKED = 101
    ERROR_ABORTED = 102
    IN_PROGRESS = 103
    ERROR_AUTH = 104
    ERROR_STORE = 105
    ERROR_STALE_EPOCH = 106
    ERROR_MISMATCH = 107
    ERROR_BUSY = 108


class DataType(enum.IntEnum):
    """``hccn_datatype`` (HcclDataType's numbers)."""

    INT8 = 0
    INT16 = 1
    INT32 = 2
    FP16 = 3
    FP32 = 4
    INT64 = 5
    UINT64 = 6
    UINT8 = 7
    UINT16 = 8
    UINT32 = 9
    FP64 = 10
    BF16 = 11


class ReduceOpCode(enum.IntEnum):
    """``hccn_reduce_op`` (HcclReduceOp's numbers; AVG is hccn's own)."""

    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    AVG = 4


UNIQUE_ID_BYTES = 128


class hccn_unique_id(ctypes.Structure):  # noqa: N801 - the C name
    _fields_ = [("internal", c_uint8 * UNIQUE_ID_BYTES)]


# Opaque handles travel as void pointers.
comm_p = c_void_p
stream_p = c_void_p
event_p = c_void_p
bucket_p = c_void_p
result_t = c_int32
dtype_t = c_int32
op_t = c_int32

# name: (restype, argtypes), in header order.
_SIGNATURES = {
    "hccn_get_error_string": (c_char_p, [result_t]),
    "hccn_get_last_error": (c_char_p, []),
    "hccn_get_version": (result_t, [POINTER(c_int32)]),
    "hccn_allreduce": (result_t, [c_void_p, c_void_p, c_uint64, dtype_t, op_t, comm_p, stream_p]),
    "hccn_allreduce_compressed": (
        result_t,
        [c_void_p, c_void_p, c_uint64, dtype_t, dtype_t, op_t, comm_p, stream_p],
    ),
    "hccn_broadcast": (result_t, [c_void_p, c_uint64, dtype_t, c_uint32, comm_p, stream_p]),
    "hccn_reduce": (result_t, [c_void_p, c_void_p, c_uint64, dtype_t, op_t, c_uint32, comm_p, stream_p]),
    "hccn_allgather": (result_t, [c_void_p, c_void_p, c_uint64, dtype_t, comm_p, stream_p]),
    "hccn_allgatherv": (
        result_t,
        [c_void_p, c_uint64, c_void_p, POINTER(c_uint64), POINTER(c_uint64), dtype_t, comm_p, stream_p],
    ),
    "hccn_reduce_scatter": (result_t, [c_void_p, c_void_p, c_uint64, dtype_t, op_t, comm_p, stream_p]),
    "hccn_gather": (result_t, [c_void_p, c_void_p, c_uint64, dtype_t, c_uint32, comm_p, stream_p]),
    "hccn_scatter": (result_t, [c_void_p, c_void_p, c_uint64, dtype_t, c_uint32, comm_p, stream_p]),
    "hccn_alltoall": (result_t, [c_void_p, c_void_p, c_uint64, dtype_t, comm_p, stream_p]),
    "hccn_alltoallv": (
        result_t,
        [
            c_void_p,
            POINTER(c_uint64),
            POINTER(c_uint64),
            c_void_p,
            POINTER(c_uint64),
            POINTER(c_uint64),
            dtype_t,
            comm_p,
            stream_p,
        ],
    ),
    "hccn_send": (result_t, [c_void_p, c_uint64, dtype_t, c_uint32, comm_p, stream_p]),
    "hccn_recv": (result_t, [c_void_p, c_uint64, dtype_t, c_uint32, comm_p, stream_p]),
    "hccn_barrier": (result_t, [comm_p, stream_p]),
    "hccn_get_unique_id": (result_t, [POINTER(hccn_unique_id)]),
    "hccn_comm_init_rank": (result_t, [POINTER(comm_p), c_uint32, POINTER(hccn_unique_id), c_uint32]),
    "hccn_init_from_env": (result_t, [POINTER(comm_p)]),
    "hccn_comm_destroy": (result_t, [comm_p]),
    "hccn_comm_abort": (result_t, [comm_p]),
    "hccn_comm_rank": (result_t, [comm_p, POINTER(c_uint32)]),
    "hccn_comm_size": (result_t, [comm_p, POINTER(c_uint32)]),
    "hccn_new_group": (result_t, [comm_p, POINTER(c_uint32), c_uint32, POINTER(comm_p)]),
    "hccn_comm_split": (result_t, [comm_p, c_int32, c_int32, POINTER(comm_p)]),
    "hccn_comm_get_async_error": (result_t, [comm_p, POINTER(result_t)]),
    "hccn_comm_failed_ranks": (result_t, [comm_p, POINTER(c_uint32), c_uint32, POINTER(c_uint32)]),
    "hccn_comm_revoke": (result_t, [comm_p]),
    "hccn_comm_epoch": (result_t, [comm_p, POINTER(c_uint64)]),
    "hccn_comm_shrink": (result_t, [comm_p, POINTER(comm_p)]),
    "hccn_comm_rebuild": (result_t, [comm_p, c_uint32, POINTER(comm_p)]),
    "hccn_bucket_create": (result_t, [comm_p, c_uint64, dtype_t, op_t, POINTER(bucket_p)]),
    "hccn_bucket_add": (result_t, [bucket_p, c_void_p, c_uint64, stream_p]),
    "hccn_bucket_flush": (result_t, [bucket_p, stream_p]),
    "hccn_bucket_destroy": (result_t, [bucket_p]),
    "hccn_stream_create": (result_t, [POINTER(stream_p)]),
    "hccn_stream_destroy": (result_t, [stream_p]),
    "hccn_stream_synchronize": (result_t, [stream_p]),
    "hccn_stream_query": (result_t, [stream_p]),
    "hccn_event_create": (result_t, [POINTER(event_p)]),
    "hccn_event_record": (result_t, [event_p, stream_p]),
    "hccn_event_query": (result_t, [event_p]),
    "hccn_event_synchronize": (result_t, [event_p]),
    "hccn_event_destroy": (result_t, [event_p]),
    "hccn_stream_wrap_acl": (result_t, [c_void_p, POINTER(stream_p)]),
}


# Where the wheel puts the library: named by its soname, so that an extension module linked
# against it (DT_NEEDED libhccn.so.1, rpath $ORIGIN/lib) shares the copy loaded here.
LIB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib")
PACKAGED = os.path.join(LIB_DIR, "libhccn.so.1")


def _candidates():
    explicit = os.environ.get("HCCN_LIB")
    if explicit:
        return [explicit]
    found = [PACKAGED]
    system = ctypes.util.find_library("hccn")
    if system:
        found.append(system)
    return found


def _load():
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(f"{path} (missing)")
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({e})")
            continue
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        return lib, path
    raise ImportError(
        "hccn: cannot load libhccn.so; tried " + "; ".join(tried) + ". Install the hccn wheel (it carries the "
        "library), or build it (cargo build --release -p hccn-capi -p hccn-tools) and reinstall the package, "
        "or set HCCN_LIB to its path."
    )


lib, library_path = _load()
