//! The HCCL calls of the double.

use hccn_runtime::sync::Locked;
use std::ffi::{c_char, c_void};

use hccn_runtime::{Communicator, DataType, ErrorKind, Op, Ptr, ReduceOp, UniqueId};

use crate::acl::{aclrtStream, bound, config, launched, recent, STREAMS};
use crate::table::Table;

pub type HcclResult = i32;
pub type HcclComm = *mut c_void;

const SUCCESS: HcclResult = 0;
const E_PARA: HcclResult = 1;
const E_PTR: HcclResult = 2;
const E_INTERNAL: HcclResult = 4;
const E_NOT_SUPPORT: HcclResult = 5;
const E_TIMEOUT: HcclResult = 9;
const E_TCP_CONNECT: HcclResult = 11;
const E_TCP_TRANSFER: HcclResult = 13;
const E_RUNTIME: HcclResult = 15;
const E_REMOTE: HcclResult = 21;

pub const ROOT_INFO_BYTES: usize = 4108;
const ROOT_MAGIC: &[u8; 8] = b"HCCLEMU1";

#[repr(C)]
#[derive(Debug)]
pub struct HcclRootInfo {
    pub internal: [u8; ROOT_INFO_BYTES],
}

/// The first 24 bytes of `HcclCommConfig` (size, magic word, version) and what follows in
/// version 2.
#[repr(C)]
#[derive(Debug)]
pub struct HcclCommConfig {
    pub size: usize,
    pub magic_word: u32,
    pub version: u32,
    pub reserved: u64,
    pub hccl_buffer_size: u32,
    pub hccl_deterministic: u32,
    pub hccl_comm_name: [u8; 128],
}

pub(crate) static COMMS: Table<Communicator> = Table::new();

fn code_of(kind: ErrorKind) -> HcclResult {
    match kind {
        ErrorKind::InvalidArgument => E_PARA,
        ErrorKind::NullPointer => E_PTR,
        ErrorKind::NotSupported => E_NOT_SUPPORT,
        ErrorKind::Timeout => E_TIMEOUT,
        ErrorKind::Connect => E_TCP_CONNECT,
        ErrorKind::Transfer => E_TCP_TRANSFER,
        ErrorKind::RankFailed | ErrorKind::Remote => E_REMOTE,
        _ => E_INTERNAL,
    }
}

fn fail(code: HcclResult, msg: &str) -> HcclResult {
    recent(msg);
    code
}

// Optional in hccn's backend: hccl-emu-minimal does not export it.
#[cfg_attr(not(hccl_emu_minimal), no_mangle)]
pub extern "C" fn HcclGetErrorString(code: HcclResult) -> *const c_char {
    let s: &'static [u8] = match code {
        0 => b"success\0",
        1 => b"parameter error\0",
        2 => b"empty pointer\0",
        3 => b"memory error\0",
        4 => b"internal error\0",
        5 => b"not support feature\0",
        6 => b"not found specific resource\0",
        7 => b"resource unavailable\0",
        8 => b"call system interface error\0",
        9 => b"timeout\0",
        11 => b"tcp connect fail\0",
        13 => b"tcp transfer fail\0",
        15 => b"call runtime api fail\0",
        21 => b"error cqe (remote)\0",
        _ => b"unknown error\0",
    };
    s.as_ptr().cast()
}

#[no_mangle]
pub unsafe extern "C" fn HcclGetRootInfo(root_info: *mut HcclRootInfo) -> HcclResult {
    if root_info.is_null() {
        return fail(E_PTR, "HcclGetRootInfo: rootInfo is NULL");
    }
    if !bound() {
        return fail(E_RUNTIME, "HcclGetRootInfo: no device bound on this thread");
    }
    match hccn_runtime::new_unique_id(&config()) {
        Ok(id) => {
            let mut b = [0u8; ROOT_INFO_BYTES];
            b[..8].copy_from_slice(ROOT_MAGIC);
            b[8..8 + 128].copy_from_slice(&id.to_bytes());
            // SAFETY: non-NULL out pointer from the caller.
            unsafe { (*root_info).internal = b };
            SUCCESS
        }
        Err(e) => fail(code_of(e.kind()), &format!("HcclGetRootInfo: {e}")),
    }
}

/// Every communicator creation is logged (HCCN_LOG=info), so that tests can see which call the
/// backend used and for how many ranks.
unsafe fn init(name: &str, n: u32, root_info: *const HcclRootInfo, rank: u32, comm: *mut HcclComm) -> HcclResult {
    if root_info.is_null() || comm.is_null() {
        return fail(E_PTR, "HcclCommInitRootInfo: rootInfo or comm is NULL");
    }
    if n == 0 || rank >= n {
        return fail(E_PARA, &format!("HcclCommInitRootInfo: rank {rank} is not below nRanks {n}"));
    }
    if !bound() {
        return fail(E_RUNTIME, "HcclCommInitRootInfo: no device bound on this thread");
    }
    // SAFETY: non-NULL; the caller passes an HcclRootInfo.
    let b = unsafe { &(*root_info).internal };
    if &b[..8] != ROOT_MAGIC {
        return fail(E_PARA, "HcclCommInitRootInfo: rootInfo did not come from HcclGetRootInfo");
    }
    let mut raw = [0u8; 128];
    raw.copy_from_slice(&b[8..8 + 128]);
    let id = match UniqueId::from_bytes(&raw) {
        Ok(id) => id,
        Err(e) => return fail(E_PARA, &format!("HcclCommInitRootInfo: {e}")),
    };
    match Communicator::init_rank(&id, n, rank, &config()) {
        Ok(c) => {
            tracing::info!("hccl-emu: {name} nRanks={n} rank={rank}");
            // SAFETY: non-NULL out pointer from the caller.
            unsafe { comm.write(COMMS.insert(c)) };
            SUCCESS
        }
        Err(e) => fail(code_of(e.kind()), &format!("HcclCommInitRootInfo: {e}")),
    }
}

#[no_mangle]
pub unsafe extern "C" fn HcclCommInitRootInfo(
    n_ranks: u32,
    root_info: *const HcclRootInfo,
    rank: u32,
    comm: *mut HcclComm,
) -> HcclResult {
    // SAFETY: forwarded caller contract.
    unsafe { init("HcclCommInitRootInfo", n_ranks, root_info, rank, comm) }
}

fn config_ok(config: *const HcclCommConfig) -> Result<(), HcclResult> {
    if config.is_null() {
        return Err(fail(E_PTR, "HcclCommConfig is NULL"));
    }
    // SAFETY: non-NULL; the caller passes at least the 24-byte header.
    let (size, magic, version) = unsafe { ((*config).size, (*config).magic_word, (*config).version) };
    if magic != 0xf0f0_f0f0 || size < 24 || version == 0 {
        return Err(fail(E_PARA, "HcclCommConfig was not initialised (HcclCommConfigInit: size, magic, version)"));
    }
    Ok(())
}

// Optional in hccn's backend: hccl-emu-minimal does not export it.
#[cfg_attr(not(hccl_emu_minimal), no_mangle)]
pub unsafe extern "C" fn HcclCommInitRootInfoConfig(
    n_ranks: u32,
    root_info: *const HcclRootInfo,
    rank: u32,
    config: *const HcclCommConfig,
    comm: *mut HcclComm,
) -> HcclResult {
    if let Err(c) = config_ok(config) {
        return c;
    }
    // SAFETY: forwarded caller contract.
    unsafe { init("HcclCommInitRootInfoConfig", n_ranks, root_info, rank, comm) }
}

// Optional in hccn's backend: hccl-emu-minimal does not export it.
#[cfg_attr(not(hccl_emu_minimal), no_mangle)]
pub unsafe extern "C" fn HcclCreateSubCommConfig(
    comm: *mut HcclComm,
    rank_num: u32,
    rank_ids: *mut u32,
    _sub_comm_id: u64,
    sub_comm_rank_id: u32,
    config: *mut HcclCommConfig,
    sub_comm: *mut HcclComm,
) -> HcclResult {
    if comm.is_null() || rank_ids.is_null() || sub_comm.is_null() {
        return fail(E_PTR, "HcclCreateSubCommConfig: a pointer argument is NULL");
    }
    if let Err(c) = config_ok(config) {
        return c;
    }
    // SAFETY: non-NULL; the caller passes a communicator handle.
    let Some(parent) = COMMS.get(unsafe { *comm }) else {
        return fail(E_PARA, "HcclCreateSubCommConfig: not a live communicator");
    };
    // SAFETY: non-NULL; the caller passes rankNum ids.
    let ids = unsafe { std::slice::from_raw_parts(rank_ids, rank_num as usize) }.to_vec();
    match parent.new_group(&ids) {
        Ok(c) if c.rank() == sub_comm_rank_id => {
            tracing::info!("hccl-emu: HcclCreateSubCommConfig rankNum={rank_num} rank={sub_comm_rank_id}");
            // SAFETY: non-NULL out pointer.
            unsafe { sub_comm.write(COMMS.insert(c)) };
            SUCCESS
        }
        Ok(c) => fail(
            E_PARA,
            &format!("HcclCreateSubCommConfig: subCommRankId {sub_comm_rank_id} but rank {} in rankIds", c.rank()),
        ),
        Err(e) => fail(code_of(e.kind()), &format!("HcclCreateSubCommConfig: {e}")),
    }
}

#[no_mangle]
pub extern "C" fn HcclCommDestroy(comm: HcclComm) -> HcclResult {
    match COMMS.remove(comm) {
        Some(_) => SUCCESS,
        None => fail(E_PARA, "HcclCommDestroy: not a live communicator"),
    }
}

#[no_mangle]
pub unsafe extern "C" fn HcclGetRankSize(comm: HcclComm, rank_size: *mut u32) -> HcclResult {
    match (COMMS.get(comm), rank_size.is_null()) {
        (Some(c), false) => {
            // SAFETY: non-NULL out pointer.
            unsafe { rank_size.write(c.size()) };
            SUCCESS
        }
        (None, _) => fail(E_PARA, "HcclGetRankSize: not a live communicator"),
        (_, true) => E_PTR,
    }
}

#[no_mangle]
pub unsafe extern "C" fn HcclGetRankId(comm: HcclComm, rank: *mut u32) -> HcclResult {
    match (COMMS.get(comm), rank.is_null()) {
        (Some(c), false) => {
            // SAFETY: non-NULL out pointer.
            unsafe { rank.write(c.rank()) };
            SUCCESS
        }
        (None, _) => fail(E_PARA, "HcclGetRankId: not a live communicator"),
        (_, true) => E_PTR,
    }
}

// Optional in hccn's backend: hccl-emu-minimal does not export it.
#[cfg_attr(not(hccl_emu_minimal), no_mangle)]
pub unsafe extern "C" fn HcclGetCommAsyncError(comm: HcclComm, async_error: *mut HcclResult) -> HcclResult {
    let Some(c) = COMMS.get(comm) else {
        return fail(E_PARA, "HcclGetCommAsyncError: not a live communicator");
    };
    if async_error.is_null() {
        return E_PTR;
    }
    let code = match c.async_error() {
        Ok(()) => SUCCESS,
        Err(e) => code_of(e.kind()),
    };
    // SAFETY: non-NULL out pointer.
    unsafe { async_error.write(code) };
    SUCCESS
}

/// Data types as HCCL's header comments list them: reductions take int8, int16, int32, fp16,
/// fp32, bf16 with sum/prod/max/min; moving operations take the 12 basic types.
fn dtype(raw: i32, name: &str) -> Result<DataType, HcclResult> {
    u32::try_from(raw)
        .ok()
        .and_then(|r| DataType::from_raw(r).ok())
        .ok_or_else(|| fail(E_PARA, &format!("{name}: dataType {raw} is not supported")))
}

fn reducing(raw_dt: i32, raw_op: i32, name: &str) -> Result<(DataType, ReduceOp), HcclResult> {
    let dt = dtype(raw_dt, name)?;
    use DataType::*;
    if !matches!(dt, Int8 | Int16 | Int32 | Fp16 | Fp32 | Bf16) {
        return Err(fail(E_PARA, &format!("{name}: dataType {} is not supported for reduction", dt.name())));
    }
    let op = match raw_op {
        0 => ReduceOp::Sum,
        1 => ReduceOp::Prod,
        2 => ReduceOp::Max,
        3 => ReduceOp::Min,
        _ => return Err(fail(E_PARA, &format!("{name}: op {raw_op} is not supported"))),
    };
    Ok((dt, op))
}

/// Common checks and the hand-off to the native runtime on the stream's host queue.
fn launch(
    name: &str,
    comm: HcclComm,
    stream: aclrtStream,
    build: impl FnOnce(u32, u32) -> Result<Op, HcclResult>,
) -> HcclResult {
    if !bound() {
        return fail(E_RUNTIME, &format!("{name}: no device bound on this thread (aclrtSetDevice)"));
    }
    let Some(c) = COMMS.get(comm) else {
        return fail(if comm.is_null() { E_PTR } else { E_PARA }, &format!("{name}: comm is not a live communicator"));
    };
    let Some(s) = STREAMS.get(stream) else {
        return fail(E_PARA, &format!("{name}: stream is not a live aclrtStream (every HCCL operation needs one)"));
    };
    let op = match build(c.rank(), c.size()) {
        Ok(op) => op,
        Err(code) => return code,
    };
    first_call(name);
    launched(stream);
    // SAFETY: HCCL's contract: the buffers stay valid until the stream has run the operation.
    match unsafe { c.submit(op, Some(&s)) } {
        Ok(()) => SUCCESS,
        Err(e) => fail(code_of(e.kind()), &format!("{name}: {e}")),
    }
}

/// Logs the first accepted call of each operation (HCCN_LOG=info), so that tests can see which
/// HCCL operations the backend used.
fn first_call(name: &str) {
    static SEEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut seen = SEEN.locked();
    if !seen.iter().any(|s| s == name) {
        seen.push(name.to_owned());
        tracing::info!("hccl-emu: first {name}");
    }
}

fn need(p: *const c_void, count: u64, what: &str, name: &str) -> Result<(), HcclResult> {
    if p.is_null() && count > 0 {
        return Err(fail(E_PTR, &format!("{name}: {what} is NULL")));
    }
    Ok(())
}

fn rank_ok(r: u32, n: u32, what: &str, name: &str) -> Result<(), HcclResult> {
    if r >= n {
        return Err(fail(E_PARA, &format!("{name}: {what} {r} is not below the rank size {n}")));
    }
    Ok(())
}

fn mp(p: *mut c_void) -> Ptr {
    Ptr::from_mut(p)
}

fn cp(p: *const c_void) -> Ptr {
    Ptr::from_const(p)
}

/// Copies `n` u64 values of a counts/displacements array.
unsafe fn u64s(p: *const c_void, n: u32, what: &str, name: &str) -> Result<Vec<u64>, HcclResult> {
    if p.is_null() {
        return Err(fail(E_PTR, &format!("{name}: {what} is NULL")));
    }
    // SAFETY: non-NULL; HCCL's contract is one uint64 per rank.
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<u64>(), n as usize) }.to_vec())
}

#[no_mangle]
pub extern "C" fn HcclAllReduce(
    send_buf: *mut c_void,
    recv_buf: *mut c_void,
    count: u64,
    data_type: i32,
    op: i32,
    comm: HcclComm,
    stream: aclrtStream,
) -> HcclResult {
    let name = "HcclAllReduce";
    launch(name, comm, stream, |_, _| {
        let (dt, op) = reducing(data_type, op, name)?;
        need(send_buf, count, "sendBuf", name)?;
        need(recv_buf, count, "recvBuf", name)?;
        Ok(Op::AllReduce { send: mp(send_buf), recv: mp(recv_buf), count, dt, op })
    })
}

#[no_mangle]
pub extern "C" fn HcclReduce(
    send_buf: *mut c_void,
    recv_buf: *mut c_void,
    count: u64,
    data_type: i32,
    op: i32,
    root: u32,
    comm: HcclComm,
    stream: aclrtStream,
) -> HcclResult {
    let name = "HcclReduce";
    launch(name, comm, stream, |me, n| {
        let (dt, op) = reducing(data_type, op, name)?;
        rank_ok(root, n, "root", name)?;
        need(send_buf, count, "sendBuf", name)?;
        if me == root {
            need(recv_buf, count, "recvBuf", name)?;
        }
        Ok(Op::Reduce { send: mp(send_buf), recv: mp(recv_buf), count, dt, op, root })
    })
}

#[no_mangle]
pub extern "C" fn HcclReduceScatter(
    send_buf: *mut c_void,
    recv_buf: *mut c_void,
    recv_count: u64,
    data_type: i32,
    op: i32,
    comm: HcclComm,
    stream: aclrtStream,
) -> HcclResult {
    let name = "HcclReduceScatter";
    launch(name, comm, stream, |_, _| {
        let (dt, op) = reducing(data_type, op, name)?;
        need(send_buf, recv_count, "sendBuf", name)?;
        need(recv_buf, recv_count, "recvBuf", name)?;
        Ok(Op::ReduceScatter { send: mp(send_buf), recv: mp(recv_buf), recv_count, dt, op })
    })
}

#[no_mangle]
pub extern "C" fn HcclBroadcast(
    buf: *mut c_void,
    count: u64,
    data_type: i32,
    root: u32,
    comm: HcclComm,
    stream: aclrtStream,
) -> HcclResult {
    let name = "HcclBroadcast";
    launch(name, comm, stream, |_, n| {
        let dt = dtype(data_type, name)?;
        rank_ok(root, n, "root", name)?;
        need(buf, count, "buf", name)?;
        Ok(Op::Broadcast { buf: mp(buf), count, dt, root })
    })
}

// Optional in hccn's backend: hccl-emu-minimal does not export it.
#[cfg_attr(not(hccl_emu_minimal), no_mangle)]
pub extern "C" fn HcclScatter(
    send_buf: *mut c_void,
    recv_buf: *mut c_void,
    recv_count: u64,
    data_type: i32,
    root: u32,
    comm: HcclComm,
    stream: aclrtStream,
) -> HcclResult {
    let name = "HcclScatter";
    launch(name, comm, stream, |me, n| {
        let dt = dtype(data_type, name)?;
        rank_ok(root, n, "root", name)?;
        if me == root {
            need(send_buf, recv_count, "sendBuf", name)?;
        }
        need(recv_buf, recv_count, "recvBuf", name)?;
        Ok(Op::Scatter { send: mp(send_buf), recv: mp(recv_buf), recv_count, dt, root })
    })
}

#[no_mangle]
pub extern "C" fn HcclAllGather(
    send_buf: *mut c_void,
    recv_buf: *mut c_void,
    send_count: u64,
    data_type: i32,
    comm: HcclComm,
    stream: aclrtStream,
) -> HcclResult {
    let name = "HcclAllGather";
    launch(name, comm, stream, |_, _| {
        let dt = dtype(data_type, name)?;
        need(send_buf, send_count, "sendBuf", name)?;
        need(recv_buf, send_count, "recvBuf", name)?;
        Ok(Op::AllGather { send: mp(send_buf), recv: mp(recv_buf), send_count, dt })
    })
}

// Optional in hccn's backend: hccl-emu-minimal does not export it.
#[cfg_attr(not(hccl_emu_minimal), no_mangle)]
pub unsafe extern "C" fn HcclAllGatherV(
    send_buf: *mut c_void,
    send_count: u64,
    recv_buf: *mut c_void,
    recv_counts: *const c_void,
    recv_displs: *const c_void,
    data_type: i32,
    comm: HcclComm,
    stream: aclrtStream,
) -> HcclResult {
    let name = "HcclAllGatherV";
    launch(name, comm, stream, |_, n| {
        let dt = dtype(data_type, name)?;
        need(send_buf, send_count, "sendBuf", name)?;
        // SAFETY: HCCL's contract: nRanks counts and displacements.
        let (counts, displs) =
            unsafe { (u64s(recv_counts, n, "recvCounts", name)?, u64s(recv_displs, n, "recvDispls", name)?) };
        Ok(Op::AllGatherV { send: mp(send_buf), send_count, recv: mp(recv_buf), recv_counts: counts, displs, dt })
    })
}

#[no_mangle]
pub extern "C" fn HcclSend(
    send_buf: *mut c_void,
    count: u64,
    data_type: i32,
    dest_rank: u32,
    comm: HcclComm,
    stream: aclrtStream,
) -> HcclResult {
    let name = "HcclSend";
    launch(name, comm, stream, |_, n| {
        let dt = dtype(data_type, name)?;
        rank_ok(dest_rank, n, "destRank", name)?;
        need(send_buf, count, "sendBuf", name)?;
        Ok(Op::Send { buf: mp(send_buf), count, dt, peer: dest_rank })
    })
}

#[no_mangle]
pub extern "C" fn HcclRecv(
    recv_buf: *mut c_void,
    count: u64,
    data_type: i32,
    src_rank: u32,
    comm: HcclComm,
    stream: aclrtStream,
) -> HcclResult {
    let name = "HcclRecv";
    launch(name, comm, stream, |_, n| {
        let dt = dtype(data_type, name)?;
        rank_ok(src_rank, n, "srcRank", name)?;
        need(recv_buf, count, "recvBuf", name)?;
        Ok(Op::Recv { buf: mp(recv_buf), count, dt, peer: src_rank })
    })
}

// Optional in hccn's backend: hccl-emu-minimal does not export it.
#[cfg_attr(not(hccl_emu_minimal), no_mangle)]
pub extern "C" fn HcclAlltoAll(
    send_buf: *const c_void,
    send_count: u64,
    send_type: i32,
    recv_buf: *const c_void,
    recv_count: u64,
    recv_type: i32,
    comm: HcclComm,
    stream: aclrtStream,
) -> HcclResult {
    let name = "HcclAlltoAll";
    launch(name, comm, stream, |_, _| {
        let dt = dtype(send_type, name)?;
        if send_type != recv_type || send_count != recv_count {
            return Err(fail(
                E_NOT_SUPPORT,
                &format!("{name}: the double needs equal send and receive types and counts"),
            ));
        }
        need(send_buf, send_count, "sendBuf", name)?;
        need(recv_buf, recv_count, "recvBuf", name)?;
        Ok(Op::AllToAll { send: cp(send_buf), recv: cp(recv_buf), count_per_rank: send_count, dt })
    })
}

#[no_mangle]
pub unsafe extern "C" fn HcclAlltoAllV(
    send_buf: *const c_void,
    send_counts: *const c_void,
    sdispls: *const c_void,
    send_type: i32,
    recv_buf: *const c_void,
    recv_counts: *const c_void,
    rdispls: *const c_void,
    recv_type: i32,
    comm: HcclComm,
    stream: aclrtStream,
) -> HcclResult {
    let name = "HcclAlltoAllV";
    launch(name, comm, stream, |_, n| {
        let dt = dtype(send_type, name)?;
        if send_type != recv_type {
            return Err(fail(E_NOT_SUPPORT, &format!("{name}: the double needs equal send and receive types")));
        }
        if !send_buf.is_null() && send_buf == recv_buf {
            return Err(fail(E_PARA, &format!("{name}: recvBuf must differ from sendBuf")));
        }
        // SAFETY: HCCL's contract: nRanks counts and displacements each.
        let (sc, sd, rc, rd) = unsafe {
            (
                u64s(send_counts, n, "sendCounts", name)?,
                u64s(sdispls, n, "sdispls", name)?,
                u64s(recv_counts, n, "recvCounts", name)?,
                u64s(rdispls, n, "rdispls", name)?,
            )
        };
        Ok(Op::AllToAllV {
            send: cp(send_buf),
            send_counts: sc,
            send_displs: sd,
            recv: cp(recv_buf),
            recv_counts: rc,
            recv_displs: rd,
            dt,
        })
    })
}

#[no_mangle]
pub extern "C" fn HcclBarrier(comm: HcclComm, stream: aclrtStream) -> HcclResult {
    launch("HcclBarrier", comm, stream, |_, _| Ok(Op::Barrier))
}
