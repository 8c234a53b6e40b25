//! Calls that must never give a quiet wrong result, for one rank of a job started by hccnrun,
//! through the C ABI. Lines starting with an upper-case word are read by tests/tests/integrity.rs.
//!
//! - `mismatch`: every collective called with one argument differing on the last rank (count,
//!   data type, reduce op, root, the kind of operation, count 0 against a count), small enough
//!   for the shared-memory board and large enough for messages, and across the two; every rank
//!   must get HCCN_ERROR_MISMATCH (107). Each case runs on a fresh group of all ranks; after it,
//!   an exact allreduce on the same group shows whether the group still works (`usable=`), and
//!   one on a new group that the job goes on.
//! - `threads`: two threads call blocking allreduces on one communicator at once, many times;
//!   every call either returns HCCN_ERROR_BUSY (108) at once or the exact result.
//! - `p2p-threads`: one thread calls blocking allreduces while another exchanges blocking
//!   Send/Recv with a partner rank on the same communicator (as a framework's stream callback
//!   does); point-to-point pairs by peer, so nothing is BUSY and every value is exact.
//! - `send-vs-collective`: on a new group per case, rank 0 sends to rank 1 where rank 1 calls an
//!   allreduce (small: the board; large: messages); rank 1 must get HCCN_ERROR_MISMATCH at its
//!   deadline, saying a send met its collective. Prints `CASE <name> code=<c> msg=<m>`.

use std::ffi::c_void;
use std::process::ExitCode;

use hccn::*;
use hccn_runtime::{DataType, Op, Ptr, ReduceOp};
use hccn_tests::capi::{check, CComm};
use hccn_tests::Coll;

/// Elements every buffer holds: enough for the largest call of any case on any rank.
const CAP: usize = 1 << 20;

/// One mismatch case: the call of rank `r` of `n`.
struct Case {
    name: &'static str,
    call: fn(r: u32, n: u32, bufs: &mut Bufs) -> Op,
}

struct Bufs {
    send: Vec<f64>,
    recv: Vec<f64>,
    counts: Vec<u64>,
    displs: Vec<u64>,
}

impl Bufs {
    fn send(&self) -> Ptr {
        Ptr::from_const(self.send.as_ptr())
    }
    fn recv(&mut self) -> Ptr {
        Ptr::from_mut(self.recv.as_mut_ptr())
    }
}

fn last(r: u32, n: u32) -> bool {
    r == n - 1
}

/// A count that differs on the last rank: `small` (board) or large (messages) elements.
fn count(r: u32, n: u32, base: u64) -> u64 {
    if last(r, n) {
        base * 2
    } else {
        base
    }
}

const SMALL: u64 = 100;
const LARGE: u64 = 3000;
/// Fp32 elements of an allgather block of 80 KiB, above the single-copy size.
const EXCHANGE: u64 = 20 * 1024;
/// Fp32 elements of a gather block of 512 KiB, which its sender copies through the ring.
const RING_GATHER: u64 = 128 * 1024;
/// Fp32 elements of a block of 640 KiB: with `HCCN_CHUNK_BYTES=65536` (integrity.rs) a step
/// offers 10 chunks for reading in place, more than `Sends` holds, so senders wait for their
/// oldest amid the step.
const WIDE: u64 = 160 * 1024;

fn cases() -> Vec<Case> {
    macro_rules! case {
        ($name:expr, |$r:ident, $n:ident, $b:ident| $op:expr) => {
            Case { name: $name, call: |$r, $n, $b| $op }
        };
    }
    vec![
        case!("allreduce-count-board", |r, n, b| Op::AllReduce {
            send: b.send(),
            recv: b.recv(),
            count: count(r, n, SMALL),
            dt: DataType::Fp32,
            op: ReduceOp::Sum
        }),
        case!("allreduce-count-messages", |r, n, b| Op::AllReduce {
            send: b.send(),
            recv: b.recv(),
            count: count(r, n, LARGE),
            dt: DataType::Fp32,
            op: ReduceOp::Sum
        }),
        case!("allreduce-board-against-messages", |r, n, b| Op::AllReduce {
            send: b.send(),
            recv: b.recv(),
            count: if last(r, n) { LARGE } else { SMALL },
            dt: DataType::Fp32,
            op: ReduceOp::Sum
        }),
        case!("allreduce-zero-against-some", |r, n, b| Op::AllReduce {
            send: b.send(),
            recv: b.recv(),
            count: if last(r, n) { 0 } else { SMALL },
            dt: DataType::Fp32,
            op: ReduceOp::Sum
        }),
        case!("allreduce-dtype-board", |r, n, b| Op::AllReduce {
            send: b.send(),
            recv: b.recv(),
            count: SMALL,
            dt: if last(r, n) { DataType::Fp64 } else { DataType::Fp32 },
            op: ReduceOp::Sum
        }),
        case!("allreduce-dtype-messages", |r, n, b| Op::AllReduce {
            send: b.send(),
            recv: b.recv(),
            count: LARGE,
            dt: if last(r, n) { DataType::Fp64 } else { DataType::Fp32 },
            op: ReduceOp::Sum
        }),
        case!("allreduce-op", |r, n, b| Op::AllReduce {
            send: b.send(),
            recv: b.recv(),
            count: SMALL,
            dt: DataType::Fp32,
            op: if last(r, n) { ReduceOp::Max } else { ReduceOp::Sum }
        }),
        case!("allreduce-against-broadcast", |r, n, b| if last(r, n) {
            Op::Broadcast { buf: b.recv(), count: LARGE, dt: DataType::Fp32, root: 0 }
        } else {
            Op::AllReduce { send: b.send(), recv: b.recv(), count: LARGE, dt: DataType::Fp32, op: ReduceOp::Sum }
        }),
        case!("broadcast-root", |r, _n, b| Op::Broadcast {
            buf: b.recv(),
            count: SMALL,
            dt: DataType::Fp32,
            root: r % 2
        }),
        case!("broadcast-root-messages", |r, n, b| Op::Broadcast {
            buf: b.recv(),
            count: LARGE,
            dt: DataType::Fp32,
            root: if last(r, n) { 1 } else { 0 }
        }),
        case!("broadcast-count", |r, n, b| Op::Broadcast {
            buf: b.recv(),
            count: count(r, n, LARGE),
            dt: DataType::Fp32,
            root: 0
        }),
        case!("reduce-root", |r, n, b| Op::Reduce {
            send: b.send(),
            recv: b.recv(),
            count: SMALL,
            dt: DataType::Fp32,
            op: ReduceOp::Sum,
            root: if last(r, n) { 1 } else { 0 }
        }),
        case!("reduce-op", |r, n, b| Op::Reduce {
            send: b.send(),
            recv: b.recv(),
            count: LARGE,
            dt: DataType::Fp32,
            op: if last(r, n) { ReduceOp::Min } else { ReduceOp::Sum },
            root: 0
        }),
        // Everyone's data leaves towards rank 0: no rank receives any (two ranks: each ends on
        // the other's data where it expects its frame).
        case!("broadcast-against-reduce", |r, n, b| if last(r, n) {
            Op::Reduce { send: b.send(), recv: b.recv(), count: LARGE, dt: DataType::Fp32, op: ReduceOp::Sum, root: 0 }
        } else {
            Op::Broadcast { buf: b.recv(), count: LARGE, dt: DataType::Fp32, root: 0 }
        }),
        // Each takes the other for the root of its reduce: both only send.
        case!("reduce-root-messages", |r, n, b| Op::Reduce {
            send: b.send(),
            recv: b.recv(),
            count: LARGE,
            dt: DataType::Fp32,
            op: ReduceOp::Sum,
            root: if last(r, n) { 0 } else { 1 }
        }),
        case!("allgather-count", |r, n, b| Op::AllGather {
            send: b.send(),
            recv: b.recv(),
            send_count: count(r, n, SMALL),
            dt: DataType::Fp32
        }),
        // One host: blocks from 64 KiB are read from their owners (pairwise), smaller ones go
        // round the ring; the last rank's block alone is that large, then every rank's is.
        case!("allgather-count-exchange-against-ring", |r, n, b| Op::AllGather {
            send: b.send(),
            recv: b.recv(),
            send_count: count(r, n, EXCHANGE / 2),
            dt: DataType::Fp32
        }),
        case!("allgather-count-exchange", |r, n, b| Op::AllGather {
            send: b.send(),
            recv: b.recv(),
            send_count: count(r, n, EXCHANGE),
            dt: DataType::Fp32
        }),
        case!("allgather-dtype", |r, n, b| Op::AllGather {
            send: b.send(),
            recv: b.recv(),
            send_count: SMALL,
            dt: if last(r, n) { DataType::Int32 } else { DataType::Fp32 }
        }),
        case!("allgatherv-counts", |r, n, b| {
            b.counts = (0..n).map(|i| 10 + u64::from(i) + if last(r, n) { 1 } else { 0 }).collect();
            b.displs = (0..n).map(|i| u64::from(i) * 100).collect();
            Op::AllGatherV {
                send: b.send(),
                send_count: b.counts[r as usize],
                recv: b.recv(),
                recv_counts: b.counts.clone(),
                displs: b.displs.clone(),
                dt: DataType::Fp32,
            }
        }),
        case!("reduce-scatter-count", |r, n, b| Op::ReduceScatter {
            send: b.send(),
            recv: b.recv(),
            recv_count: count(r, n, SMALL),
            dt: DataType::Fp32,
            op: ReduceOp::Sum
        }),
        case!("gather-root", |r, n, b| Op::Gather {
            send: b.send(),
            recv: b.recv(),
            send_count: SMALL,
            dt: DataType::Fp32,
            root: if last(r, n) { 1 } else { 0 }
        }),
        case!("gather-count", |r, n, b| Op::Gather {
            send: b.send(),
            recv: b.recv(),
            send_count: count(r, n, SMALL),
            dt: DataType::Fp32,
            root: 0
        }),
        case!("scatter-root", |r, n, b| Op::Scatter {
            send: b.send(),
            recv: b.recv(),
            recv_count: SMALL,
            dt: DataType::Fp32,
            root: if last(r, n) { 1 } else { 0 }
        }),
        // Two ranks check gather and scatter of small blocks with one frame crossing the data
        // (verify.rs): each takes the other for the root of its gather (both only send) ...
        case!("gather-root-messages", |r, n, b| Op::Gather {
            send: b.send(),
            recv: b.recv(),
            send_count: LARGE,
            dt: DataType::Fp32,
            root: if last(r, n) { 0 } else { 1 }
        }),
        // ... or itself for the root of its scatter (both only send) ...
        case!("scatter-root-messages", |r, n, b| Op::Scatter {
            send: b.send(),
            recv: b.recv(),
            recv_count: LARGE,
            dt: DataType::Fp32,
            root: if last(r, n) { 1 } else { 0 }
        }),
        // ... or one gathers to rank 0 what rank 0 scatters (both only receive) ...
        case!("gather-against-scatter", |r, n, b| if last(r, n) {
            Op::Scatter { send: b.send(), recv: b.recv(), recv_count: LARGE, dt: DataType::Fp32, root: 0 }
        } else {
            Op::Gather { send: b.send(), recv: b.recv(), send_count: LARGE, dt: DataType::Fp32, root: 0 }
        }),
        // The same with blocks read in place (from 64 KiB), and copied through the ring by
        // the sender (a gather's from 512 KiB): a sender waits for its reader, and must hear
        // first that there is none.
        case!("gather-root-messages-single-copy", |r, n, b| Op::Gather {
            send: b.send(),
            recv: b.recv(),
            send_count: EXCHANGE,
            dt: DataType::Fp32,
            root: if last(r, n) { 0 } else { 1 }
        }),
        case!("gather-root-messages-ring", |r, n, b| Op::Gather {
            send: b.send(),
            recv: b.recv(),
            send_count: RING_GATHER,
            dt: DataType::Fp32,
            root: if last(r, n) { 0 } else { 1 }
        }),
        case!("scatter-root-messages-single-copy", |r, n, b| Op::Scatter {
            send: b.send(),
            recv: b.recv(),
            recv_count: EXCHANGE,
            dt: DataType::Fp32,
            root: if last(r, n) { 1 } else { 0 }
        }),
        case!("gather-against-scatter-single-copy", |r, n, b| if last(r, n) {
            Op::Scatter { send: b.send(), recv: b.recv(), recv_count: EXCHANGE, dt: DataType::Fp32, root: 0 }
        } else {
            Op::Gather { send: b.send(), recv: b.recv(), send_count: EXCHANGE, dt: DataType::Fp32, root: 0 }
        }),
        // ... and the last rank scatters from itself what the others gather to it (all send).
        case!("scatter-against-gather-all-send", |r, n, b| if last(r, n) {
            Op::Scatter { send: b.send(), recv: b.recv(), recv_count: EXCHANGE, dt: DataType::Fp32, root: n - 1 }
        } else {
            Op::Gather { send: b.send(), recv: b.recv(), send_count: EXCHANGE, dt: DataType::Fp32, root: n - 1 }
        }),
        // ... or one block is small enough for the crossing and the other is not.
        case!("gather-count-crossing-against-barrier", |r, n, b| Op::Gather {
            send: b.send(),
            recv: b.recv(),
            send_count: if last(r, n) { 20_000 } else { LARGE },
            dt: DataType::Fp32,
            root: 0
        }),
        case!("alltoall-count", |r, n, b| Op::AllToAll {
            send: b.send(),
            recv: b.recv(),
            count_per_rank: count(r, n, SMALL),
            dt: DataType::Fp32
        }),
        case!("alltoallv-counts", |r, n, b| {
            // Every rank sends 10 to each; the last rank expects 11 from rank 0.
            b.counts = vec![10; n as usize];
            b.displs = (0..n).map(|i| u64::from(i) * 100).collect();
            let mut recv_counts = b.counts.clone();
            if last(r, n) {
                recv_counts[0] = 11;
            }
            Op::AllToAllV {
                send: b.send(),
                send_counts: b.counts.clone(),
                send_displs: b.displs.clone(),
                recv: b.recv(),
                recv_counts,
                recv_displs: b.displs.clone(),
                dt: DataType::Fp32,
            }
        }),
        case!("alltoall-count-wide", |r, n, b| Op::AllToAll {
            send: b.send(),
            recv: b.recv(),
            count_per_rank: count(r, n, WIDE),
            dt: DataType::Fp32
        }),
        case!("allgather-count-wide", |r, n, b| Op::AllGather {
            send: b.send(),
            recv: b.recv(),
            send_count: count(r, n, WIDE),
            dt: DataType::Fp32
        }),
        case!("scatter-count-wide", |r, n, b| Op::Scatter {
            send: b.send(),
            recv: b.recv(),
            recv_count: count(r, n, WIDE),
            dt: DataType::Fp32,
            root: 0
        }),
        case!("barrier-against-allreduce", |r, n, b| if last(r, n) {
            Op::Barrier
        } else {
            Op::AllReduce { send: b.send(), recv: b.recv(), count: LARGE, dt: DataType::Fp32, op: ReduceOp::Sum }
        }),
    ]
}

fn send_vs_collective(world: &CComm) -> ExitCode {
    for (name, count) in [("small", 4usize), ("large", 1 << 16)] {
        let Ok(g) = group(world) else { return ExitCode::FAILURE };
        let data = vec![1f32; count];
        let mut out = vec![0f32; count];
        // SAFETY: both buffers hold `count` floats for the blocking calls.
        let code = unsafe {
            match g.rank() {
                0 => hccn_send(data.as_ptr().cast(), 4, 4, 1, g.comm, std::ptr::null_mut()),
                1 => hccn_allreduce(
                    data.as_ptr().cast(),
                    out.as_mut_ptr().cast(),
                    count as u64,
                    4, // HCCN_FP32
                    0, // HCCN_SUM
                    g.comm,
                    std::ptr::null_mut(),
                ),
                _ => 0,
            }
        };
        let (code, msg) = check(code).err().unwrap_or((0, String::new()));
        println!("CASE {name} rank={} code={code} msg={msg}", g.rank());
        // Nobody leaves the group before rank 1's deadline has passed (the barrier has the same
        // deadline: rank 0 waits out rank 1's first).
        if g.rank() != 1 {
            std::thread::sleep(std::time::Duration::from_millis(2500));
        }
        // SAFETY: a valid handle.
        if check(unsafe { hccn_barrier(world.comm, std::ptr::null_mut()) }).is_err() {
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

fn group(c: &CComm) -> Result<CComm, (u32, String)> {
    let ranks: Vec<u32> = (0..c.size()).collect();
    let mut out = std::ptr::null_mut();
    // SAFETY: valid handle, list and out pointer.
    check(unsafe { hccn_new_group(c.comm, ranks.as_ptr(), ranks.len() as u32, &mut out) })?;
    Ok(CComm { comm: out })
}

/// One exact allreduce: Ok when every element is right.
fn exact(c: &CComm) -> Result<(), String> {
    let n = c.size();
    let send: Vec<f32> = (0..1000).map(|j| (j % 7) as f32 + c.rank() as f32).collect();
    let mut recv = vec![0f32; send.len()];
    // SAFETY: both buffers hold 1000 floats for the blocking call.
    check(unsafe {
        hccn_allreduce(
            send.as_ptr().cast::<c_void>(),
            recv.as_mut_ptr().cast(),
            1000,
            4,
            0,
            c.comm,
            std::ptr::null_mut(),
        )
    })
    .map_err(|(code, msg)| format!("code {code}: {msg}"))?;
    let want = |j: usize| (n as usize * (j % 7) + (n as usize * (n as usize - 1)) / 2) as f32;
    match recv.iter().enumerate().find(|(j, v)| **v != want(*j)) {
        Some((j, v)) => Err(format!("element {j} is {v}, not {}", want(j))),
        None => Ok(()),
    }
}

fn mismatch(world: &CComm) -> ExitCode {
    let (r, n) = (world.rank(), world.size());
    let mut bufs = Bufs { send: vec![1.0; CAP], recv: vec![0.0; CAP * n as usize], counts: vec![], displs: vec![] };
    let mut bad = false;
    for case in cases() {
        let g = match group(world) {
            Ok(g) => g,
            Err((code, msg)) => {
                println!("GROUP_FAILED case={} code={code} msg={msg}", case.name);
                return ExitCode::FAILURE;
            }
        };
        let op = (case.call)(r, n, &mut bufs);
        let t = std::time::Instant::now();
        // SAFETY: every buffer holds more than any case's call reads or writes.
        let got = unsafe { g.run(op) };
        let ms = t.elapsed().as_millis();
        let (code, msg) = got.err().unwrap_or((0, String::new()));
        let usable = exact(&g).is_ok();
        println!("CASE {} code={code} ms={ms} usable={usable} msg={msg}", case.name);
        bad |= code != 107;
        // The job goes on, whatever became of the group.
        let fresh = group(world).map_err(|(c, m)| format!("code {c}: {m}")).and_then(|g| exact(&g));
        if let Err(e) = fresh {
            println!("AFTER case={} {e}", case.name);
            return ExitCode::FAILURE;
        }
    }
    if bad {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn threads(c: &CComm) -> ExitCode {
    let n = c.size();
    let comm = c.comm as usize;
    // Both threads start together and call until the first error: a board allreduce takes well
    // under a microsecond, so a fixed run of calls could end before the other thread starts.
    let start = std::sync::Arc::new(std::sync::Barrier::new(2));
    let run = move |me: u32, start: std::sync::Arc<std::sync::Barrier>| {
        let (mut ok, mut busy, mut wrong, mut other) = (0u32, 0u32, 0u32, 0u32);
        start.wait();
        for i in 0..200_000u32 {
            let val = (me * 1000 + i) as f32;
            let send = vec![val; 64];
            let mut recv = vec![0f32; 64];
            // SAFETY: the communicator lives until both threads are joined; buffers live for the call.
            let r = check(unsafe {
                hccn_allreduce(
                    send.as_ptr().cast::<c_void>(),
                    recv.as_mut_ptr().cast(),
                    64,
                    4,
                    0,
                    comm as *mut hccn_comm,
                    std::ptr::null_mut(),
                )
            });
            match r {
                Ok(()) if recv.iter().all(|v| *v == val * n as f32) => ok += 1,
                Ok(()) => wrong += 1,
                Err((108, _)) => busy += 1,
                Err(_) => other += 1,
            }
            // Once BUSY broke the communicator every call on every rank fails: stop at the first.
            if busy + other > 0 {
                break;
            }
        }
        (ok, busy, wrong, other)
    };
    // Every rank's thread `t` uses values of its own series: a call paired with another thread's
    // call on another rank would sum values of two series and show as wrong.
    let start_b = start.clone();
    let a = std::thread::spawn(move || run(1, start));
    let b = std::thread::spawn(move || run(2, start_b));
    let (a, b) = (a.join(), b.join());
    let (Ok(a), Ok(b)) = (a, b) else {
        println!("THREADS panicked");
        return ExitCode::FAILURE;
    };
    println!("THREADS ok={} busy={} wrong={} other={}", a.0 + b.0, a.1 + b.1, a.2 + b.2, a.3 + b.3);
    ExitCode::SUCCESS
}

/// Blocking allreduces on one thread, Send/Recv with rank `r ^ 1` on another (even `n`).
fn p2p_threads(c: &CComm) -> ExitCode {
    let (r, n) = (c.rank(), c.size());
    let comm = c.comm as usize;
    let collectives = move || {
        let mut bad = 0u32;
        for i in 0..300u32 {
            let send = vec![i as f32; 64];
            let mut recv = vec![0f32; 64];
            // SAFETY: the communicator outlives the joined threads; buffers live for the call.
            let got = check(unsafe {
                hccn_allreduce(
                    send.as_ptr().cast::<c_void>(),
                    recv.as_mut_ptr().cast(),
                    64,
                    4,
                    0,
                    comm as *mut hccn_comm,
                    std::ptr::null_mut(),
                )
            });
            if got.is_err() || recv.iter().any(|v| *v != i as f32 * n as f32) {
                bad += 1;
            }
        }
        bad
    };
    let messages = move || {
        let partner = r ^ 1;
        let mut bad = 0u32;
        for i in 0..300u32 {
            let mine = vec![(r * 100_000 + i) as f64; 32];
            let mut theirs = vec![0f64; 32];
            let peer = comm as *mut hccn_comm;
            // SAFETY: as above; 32 doubles each way, the lower rank sends first.
            let (a, b) = unsafe {
                let send = || check(hccn_send(mine.as_ptr().cast(), 32, 10, partner, peer, std::ptr::null_mut()));
                let recv = |buf: &mut Vec<f64>| {
                    check(hccn_recv(buf.as_mut_ptr().cast(), 32, 10, partner, peer, std::ptr::null_mut()))
                };
                if r < partner {
                    let a = send();
                    (a, recv(&mut theirs))
                } else {
                    let b = recv(&mut theirs);
                    (send(), b)
                }
            };
            if a.is_err() || b.is_err() || theirs.iter().any(|v| *v != (partner * 100_000 + i) as f64) {
                bad += 1;
            }
        }
        bad
    };
    let a = std::thread::spawn(collectives);
    let b = std::thread::spawn(messages);
    match (a.join(), b.join()) {
        (Ok(a), Ok(b)) => {
            println!("P2P_THREADS collectives_bad={a} messages_bad={b}");
            ExitCode::SUCCESS
        }
        _ => {
            println!("P2P_THREADS panicked");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let comm = match hccn_tests::capi::start_worker() {
        Ok(c) => c,
        Err(code) => return code,
    };
    match mode.as_str() {
        "mismatch" => mismatch(&comm),
        "threads" => threads(&comm),
        "p2p-threads" => p2p_threads(&comm),
        "send-vs-collective" => send_vs_collective(&comm),
        other => {
            eprintln!("unknown mode {other:?}");
            ExitCode::from(2)
        }
    }
}
