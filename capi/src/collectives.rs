//! Collective functions of docs/c-api.md. Each converts its C arguments and hands an [`Op`] to the
//! runtime's one validating entry point, `Communicator::submit`.

use std::ffi::c_void;

use hccn_runtime::{DataType, Op, Ptr, ReduceOp, Result};

use crate::comm::COMMS;
use crate::ffi::{array, guard, ok};
use crate::stream::STREAMS;
use crate::types::{hccn_comm, hccn_datatype, hccn_reduce_op, hccn_result, hccn_stream};

/// A call as far as it can be known before its arguments are read: its kind (an `Op::name`) and,
/// for a send or receive, its peer.
type Call = (&'static str, Option<u32>);

/// Looks up `comm` and `stream`, builds the op (which may need the communicator size) and hands
/// it to the communicator's backend. A call refused here (a stream handle or an argument it
/// cannot read) still takes its place among the other ranks' calls (`refuse_unread`).
fn submit(
    comm: *mut hccn_comm,
    stream: *mut hccn_stream,
    (kind, peer): Call,
    build: impl FnOnce(u32) -> Result<Op>,
) -> hccn_result {
    guard(|| {
        let c = COMMS.get(comm, "comm")?;
        let s = match stream.is_null() {
            true => None,
            false => Some(STREAMS.get(stream, "stream").map_err(|e| c.refuse_unread(kind, peer, e, None))?),
        };
        let op = build(c.control().size()).map_err(|e| c.refuse_unread(kind, peer, e, s.as_deref()))?;
        // SAFETY: the C caller promises the buffers of `op` as docs/c-api.md describes, until the
        // operation completes (return for a NULL stream, the stream's progress otherwise).
        unsafe { c.submit(op, s.as_deref())? };
        ok()
    })
}

fn dtype(raw: hccn_datatype) -> Result<DataType> {
    DataType::from_raw(raw)
}

fn rop(raw: hccn_reduce_op) -> Result<ReduceOp> {
    ReduceOp::from_raw(raw)
}

fn cp(p: *const c_void) -> Ptr {
    Ptr::from_const(p)
}

fn mp(p: *mut c_void) -> Ptr {
    Ptr::from_mut(p)
}

#[no_mangle]
pub unsafe extern "C" fn hccn_allreduce(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: u64,
    dt: hccn_datatype,
    op: hccn_reduce_op,
    comm: *mut hccn_comm,
    stream: *mut hccn_stream,
) -> hccn_result {
    submit(comm, stream, ("allreduce", None), |_| {
        Ok(Op::AllReduce { send: cp(sendbuf), recv: mp(recvbuf), count, dt: dtype(dt)?, op: rop(op)? })
    })
}

/// Allreduce of `dt` data that travels on the wire as `wire_dt` and is accumulated in `dt`:
/// FP32 over FP16 or BF16. Error bound: docs/algorithms.md.
#[no_mangle]
pub unsafe extern "C" fn hccn_allreduce_compressed(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: u64,
    dt: hccn_datatype,
    wire_dt: hccn_datatype,
    op: hccn_reduce_op,
    comm: *mut hccn_comm,
    stream: *mut hccn_stream,
) -> hccn_result {
    submit(comm, stream, ("allreduce_compressed", None), |_| {
        Ok(Op::AllReduceCompressed {
            send: cp(sendbuf),
            recv: mp(recvbuf),
            count,
            dt: dtype(dt)?,
            wire: dtype(wire_dt).map_err(|e| e.context("wire_dt"))?,
            op: rop(op)?,
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hccn_broadcast(
    buf: *mut c_void,
    count: u64,
    dt: hccn_datatype,
    root: u32,
    comm: *mut hccn_comm,
    stream: *mut hccn_stream,
) -> hccn_result {
    submit(comm, stream, ("broadcast", None), |_| Ok(Op::Broadcast { buf: mp(buf), count, dt: dtype(dt)?, root }))
}

#[no_mangle]
pub unsafe extern "C" fn hccn_reduce(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: u64,
    dt: hccn_datatype,
    op: hccn_reduce_op,
    root: u32,
    comm: *mut hccn_comm,
    stream: *mut hccn_stream,
) -> hccn_result {
    submit(comm, stream, ("reduce", None), |_| {
        Ok(Op::Reduce { send: cp(sendbuf), recv: mp(recvbuf), count, dt: dtype(dt)?, op: rop(op)?, root })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hccn_allgather(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    sendcount: u64,
    dt: hccn_datatype,
    comm: *mut hccn_comm,
    stream: *mut hccn_stream,
) -> hccn_result {
    submit(comm, stream, ("allgather", None), |_| {
        Ok(Op::AllGather { send: cp(sendbuf), recv: mp(recvbuf), send_count: sendcount, dt: dtype(dt)? })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hccn_allgatherv(
    sendbuf: *const c_void,
    sendcount: u64,
    recvbuf: *mut c_void,
    recvcounts: *const u64,
    displs: *const u64,
    dt: hccn_datatype,
    comm: *mut hccn_comm,
    stream: *mut hccn_stream,
) -> hccn_result {
    submit(comm, stream, ("allgatherv", None), |n| {
        Ok(Op::AllGatherV {
            send: cp(sendbuf),
            send_count: sendcount,
            recv: mp(recvbuf),
            recv_counts: array(recvcounts, n as usize, "recvcounts")?,
            displs: array(displs, n as usize, "displs")?,
            dt: dtype(dt)?,
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hccn_reduce_scatter(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: u64,
    dt: hccn_datatype,
    op: hccn_reduce_op,
    comm: *mut hccn_comm,
    stream: *mut hccn_stream,
) -> hccn_result {
    submit(comm, stream, ("reduce_scatter", None), |_| {
        Ok(Op::ReduceScatter {
            send: cp(sendbuf),
            recv: mp(recvbuf),
            recv_count: recvcount,
            dt: dtype(dt)?,
            op: rop(op)?,
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hccn_gather(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    sendcount: u64,
    dt: hccn_datatype,
    root: u32,
    comm: *mut hccn_comm,
    stream: *mut hccn_stream,
) -> hccn_result {
    submit(comm, stream, ("gather", None), |_| {
        Ok(Op::Gather { send: cp(sendbuf), recv: mp(recvbuf), send_count: sendcount, dt: dtype(dt)?, root })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hccn_scatter(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: u64,
    dt: hccn_datatype,
    root: u32,
    comm: *mut hccn_comm,
    stream: *mut hccn_stream,
) -> hccn_result {
    submit(comm, stream, ("scatter", None), |_| {
        Ok(Op::Scatter { send: cp(sendbuf), recv: mp(recvbuf), recv_count: recvcount, dt: dtype(dt)?, root })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hccn_alltoall(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count_per_rank: u64,
    dt: hccn_datatype,
    comm: *mut hccn_comm,
    stream: *mut hccn_stream,
) -> hccn_result {
    submit(comm, stream, ("alltoall", None), |_| {
        Ok(Op::AllToAll { send: cp(sendbuf), recv: mp(recvbuf), count_per_rank, dt: dtype(dt)? })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hccn_alltoallv(
    sendbuf: *const c_void,
    sendcounts: *const u64,
    sdispls: *const u64,
    recvbuf: *mut c_void,
    recvcounts: *const u64,
    rdispls: *const u64,
    dt: hccn_datatype,
    comm: *mut hccn_comm,
    stream: *mut hccn_stream,
) -> hccn_result {
    submit(comm, stream, ("alltoallv", None), |n| {
        let n = n as usize;
        Ok(Op::AllToAllV {
            send: cp(sendbuf),
            send_counts: array(sendcounts, n, "sendcounts")?,
            send_displs: array(sdispls, n, "sdispls")?,
            recv: mp(recvbuf),
            recv_counts: array(recvcounts, n, "recvcounts")?,
            recv_displs: array(rdispls, n, "rdispls")?,
            dt: dtype(dt)?,
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn hccn_send(
    buf: *const c_void,
    count: u64,
    dt: hccn_datatype,
    peer: u32,
    comm: *mut hccn_comm,
    stream: *mut hccn_stream,
) -> hccn_result {
    submit(comm, stream, ("send", Some(peer)), |_| Ok(Op::Send { buf: cp(buf), count, dt: dtype(dt)?, peer }))
}

#[no_mangle]
pub unsafe extern "C" fn hccn_recv(
    buf: *mut c_void,
    count: u64,
    dt: hccn_datatype,
    peer: u32,
    comm: *mut hccn_comm,
    stream: *mut hccn_stream,
) -> hccn_result {
    submit(comm, stream, ("recv", Some(peer)), |_| Ok(Op::Recv { buf: mp(buf), count, dt: dtype(dt)?, peer }))
}

#[no_mangle]
pub unsafe extern "C" fn hccn_barrier(comm: *mut hccn_comm, stream: *mut hccn_stream) -> hccn_result {
    submit(comm, stream, ("barrier", None), |_| Ok(Op::Barrier))
}
