#!/usr/bin/env python3
"""Writes the committed seed corpus (fuzz/corpus/<target>/): one valid example of each message
the targets parse, so the fuzzers start from the real formats. Re-run after a format change."""
import os, struct

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.join(here, "..", "corpus")

def put(target, name, data):
    d = os.path.join(root, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)

# frame: magic "HCCN" (LE 0x4843434e), version 1, kind, flags 0, comm, epoch, seq, tag, reserved, len
def frame(kind, comm=7, epoch=0, seq=1, tag=0, length=0):
    return struct.pack("<IHBBQQQIIQ", 0x4843434E, 1, kind, 0, comm, epoch, seq, tag, 0, length)
for k in range(1, 7):
    put("frame", f"kind{k}", frame(k, length=0 if k in (3, 5, 6) else 4096))
put("frame", "max_len", frame(1, length=8 << 20))
put("frame", "over_len", frame(1, length=(8 << 20) + 1))

# store: op u8 | key_len u32 | key | val_len u32 | val
def req(op, key, val):
    return bytes([op]) + struct.pack("<I", len(key)) + key + struct.pack("<I", len(val)) + val
put("store", "set_get", req(1, b"job/a/addr/0", b"127.0.0.1:4000") + req(2, b"job/a/addr/0", struct.pack("<Q", 0)))
put("store", "add", req(3, b"n", struct.pack("<q", 5)) + req(3, b"n", struct.pack("<q", -2)))
put("store", "create", req(4, b"once", b"a") + req(4, b"once", b"b") + req(2, b"missing", struct.pack("<Q", 1000)))
put("store", "bad_op", req(9, b"k", b""))
put("store", "huge_len", bytes([1]) + struct.pack("<I", 0xFFFFFFFF))

# handshake: first byte picks the purpose; then "HCCNAUTH" purpose nonce[32] (+ a proof)
for p in (1, 2):
    put("handshake", f"hello{p}", bytes([p % 2]) + b"HCCNAUTH" + bytes([p]) + bytes(range(32)) + bytes(64) + b"\x01")

# bootstrap: first byte picks the message (see hccn_runtime::fuzzing::bootstrap)
uid = b"HCID" + bytes([1, 4]) + struct.pack(">H", 4242) + bytes([127, 0, 0, 1]) + bytes(12) + bytes(range(32)) + bytes(range(16))
put("bootstrap", "unique_id_v4", bytes([0]) + uid + bytes(128 - len(uid)))
uid6 = b"HCID" + bytes([1, 6]) + struct.pack(">H", 80) + bytes(15) + b"\x01" + bytes(32) + bytes(16)
put("bootstrap", "unique_id_v6", bytes([0]) + uid6 + bytes(128 - len(uid6)))
put("bootstrap", "store_addr", bytes([1]) + b"tcp://127.0.0.1:29500")
put("bootstrap", "store_addr_etcd", bytes([1]) + b"etcd://127.0.0.1:2379,127.0.0.1:2380")
put("bootstrap", "hello", bytes([2]) + struct.pack("<QII", 0x1234, 3, 4))
adm = struct.pack("<QQII", 9, 1, 3, 1) + struct.pack("<QI", 17, 14) + b"127.0.0.1:5000"
put("bootstrap", "admission", bytes([3]) + adm)
put("bootstrap", "peer_addr", bytes([4]) + b"[::1]:4000")
put("bootstrap", "agree_state", bytes([5, 3]) + bytes([1]) + struct.pack("<II", 1, 2) + bytes([1]) + struct.pack("<III", 0, 1, 2))
put("bootstrap", "agree_commit", bytes([5, 3]) + bytes([4]) + struct.pack("<II", 1, 3))

# capi: a few call sequences (selector, pointer choices, dtype, op, comm, stream, counts...)
put("capi", "allreduce", bytes([0, 1, 1, 1, 7, 1, 0, 3, 4]) + struct.pack("<Q", 100))
put("capi", "bcast_stream", bytes([2, 1, 1, 1, 2, 1, 0, 3, 2]) + struct.pack("<Q", 64) + bytes([1, 0]))
put("capi", "mixed", bytes(range(0, 200, 3)))
