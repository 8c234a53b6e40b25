//! The argument-check class of the mismatch matrix, for one rank of a job started by hccnrun,
//! through the C ABI: every argument check x every collective x which ranks fail it (the root
//! only, the last rank only, every rank), small enough for the shared-memory board and large
//! enough for messages. A rank whose check fails must get its own refusal (INVALID_ARGUMENT or
//! NULL_POINTER); every other rank of the call HCCN_ERROR_MISMATCH (never success: the refusing
//! rank made no call that could pair with theirs); and the next call must pair with the next
//! call everywhere: an exact allreduce on the same communicator after every case. Point-to-point
//! refusals (the sender's, the receiver's, both) are followed by an exact exchange.
//!
//! Prints `CASE <name> code=<c> want=<w> next=<ok|error>` per case and exits 1 if any is wrong.

use std::ffi::c_void;
use std::process::ExitCode;

use hccn::*;
use hccn_runtime::{DataType, Op, Ptr, ReduceOp};
use hccn_tests::capi::{check, CComm};
use hccn_tests::Coll;

const SMALL: u64 = 100;
const LARGE: u64 = 3000;
const INVALID: u32 = 1;
const NULL: u32 = 2;
const MISMATCH: u32 = 107;

#[derive(Clone, Copy, Debug)]
enum Who {
    /// Rank 0, the root of the rooted calls.
    Root,
    /// The last rank, never the root.
    Last,
    Every,
}

#[derive(Clone, Copy, Debug)]
enum Check {
    /// A buffer the call reads or writes is NULL.
    Null,
    /// The receive buffer starts one element into the send buffer.
    Overlap,
    /// The root is outside the communicator.
    Root,
}

/// Buffers far apart, each larger than any call needs.
struct Bufs {
    send: Vec<f32>,
    recv: Vec<f32>,
}

impl Bufs {
    fn send(&self) -> Ptr {
        Ptr::from_const(self.send.as_ptr())
    }
    fn recv(&mut self) -> Ptr {
        Ptr::from_mut(self.recv.as_mut_ptr())
    }
}

const KINDS: [&str; 9] =
    ["allreduce", "reduce", "broadcast", "allgather", "reduce_scatter", "gather", "scatter", "alltoall", "allgatherv"];

fn rooted(kind: &str) -> bool {
    matches!(kind, "reduce" | "broadcast" | "gather" | "scatter")
}

/// The call of `kind` with `count` elements per block; `bad` applies `check` to it.
fn call(kind: &str, count: u64, n: u32, b: &mut Bufs, bad: Option<Check>) -> Op {
    let dt = DataType::Fp32;
    let (mut send, mut recv, mut root) = (b.send(), b.recv(), 0u32);
    match bad {
        Some(Check::Null) if kind == "broadcast" => recv = Ptr::null(),
        Some(Check::Null) => send = Ptr::null(),
        Some(Check::Overlap) => recv = Ptr(send.0.wrapping_add(4)),
        Some(Check::Root) => root = n,
        None => {}
    }
    let op = ReduceOp::Sum;
    match kind {
        "allreduce" => Op::AllReduce { send, recv, count, dt, op },
        "reduce" => Op::Reduce { send, recv, count, dt, op, root },
        "broadcast" => Op::Broadcast { buf: recv, count, dt, root },
        "allgather" => Op::AllGather { send, recv, send_count: count, dt },
        "reduce_scatter" => Op::ReduceScatter { send, recv, recv_count: count, dt, op },
        "gather" => Op::Gather { send, recv, send_count: count, dt, root },
        "scatter" => Op::Scatter { send, recv, recv_count: count, dt, root },
        "alltoall" => Op::AllToAll { send, recv, count_per_rank: count, dt },
        _ => Op::AllGatherV {
            send,
            send_count: count,
            recv,
            recv_counts: vec![count; n as usize],
            displs: (0..n as u64).map(|i| i * count).collect(),
            dt,
        },
    }
}

fn applies(kind: &str, check: Check) -> bool {
    match check {
        Check::Null => true,
        // A broadcast has one buffer.
        Check::Overlap => kind != "broadcast",
        Check::Root => rooted(kind),
    }
}

/// Whether rank `r` of `n` passes a bad argument.
fn among(who: Who, r: u32, n: u32) -> bool {
    match who {
        Who::Root => r == 0,
        Who::Last => r == n - 1,
        Who::Every => true,
    }
}

/// Whether rank `r` of `n` refuses: it passes a bad argument and its call fails `check` there
/// (the buffers of a rooted call's non-root may overlap: its receive buffer is not used).
fn refuses(kind: &str, check: Check, who: Who, r: u32, n: u32) -> bool {
    among(who, r, n) && !(matches!(check, Check::Overlap) && rooted(kind) && r != 0)
}

/// One exact allreduce on `c`: whether every element is right.
fn exact(c: &CComm, salt: f32) -> bool {
    let n = c.size() as f32;
    let send: Vec<f32> = (0..64).map(|j| j as f32 + salt + c.rank() as f32).collect();
    let mut recv = vec![0f32; send.len()];
    if c.allreduce_f32(&send, &mut recv, 0).is_err() {
        return false;
    }
    recv.iter().enumerate().all(|(j, v)| *v == n * (j as f32 + salt) + n * (n - 1.0) / 2.0)
}

fn collectives(c: &CComm, bufs: &mut Bufs) -> bool {
    let (r, n) = (c.rank(), c.size());
    let mut good = true;
    let mut salt = 0.0;
    for kind in KINDS {
        for check in [Check::Null, Check::Overlap, Check::Root] {
            for who in [Who::Root, Who::Last, Who::Every] {
                for count in [SMALL, LARGE] {
                    if !applies(kind, check) {
                        continue;
                    }
                    let mine = refuses(kind, check, who, r, n);
                    let any = (0..n).any(|q| refuses(kind, check, who, q, n));
                    let op = call(kind, count, n, bufs, among(who, r, n).then_some(check));
                    // SAFETY: every buffer holds more than any call reads or writes; the
                    // refused calls' pointers are never dereferenced.
                    let code = unsafe { c.run(op) }.err().map_or(0, |(code, _)| code);
                    // Where every rank refused alike, nobody meets a differing call.
                    let want: &[u32] = match (mine, any) {
                        (true, _) => &[INVALID, NULL],
                        (false, true) => &[MISMATCH],
                        (false, false) => &[0],
                    };
                    salt += 1.0;
                    let next = exact(c, salt);
                    let ok = want.contains(&code) && next;
                    good &= ok;
                    println!(
                        "CASE {kind}-{check:?}-{who:?}-{count} code={code} want={want:?} next={} {}",
                        if next { "ok" } else { "error" },
                        if ok { "PASS" } else { "FAIL" }
                    );
                }
            }
        }
    }
    good
}

/// Send/recv refused on the sender, the receiver, or both, between ranks 0 and 1; then an exact
/// exchange shows that the pair's later messages kept their pairing.
fn point_to_point(c: &CComm) -> bool {
    let r = c.rank();
    if r > 1 {
        return true;
    }
    let peer = 1 - r;
    let mut good = true;
    for (name, bad_sender, bad_receiver) in [("sender", true, false), ("receiver", false, true), ("both", true, true)] {
        let sends = r == 0;
        let bad = if sends { bad_sender } else { bad_receiver };
        let data: Vec<i32> = (0..16).map(|j| j + 100 * name.len() as i32).collect();
        let mut got = vec![0i32; 16];
        let ptr = if bad { std::ptr::null_mut() } else { got.as_mut_ptr().cast::<c_void>() };
        // SAFETY: 16 int32 elements on both sides (or NULL, refused).
        let code = unsafe {
            match sends {
                true if bad => hccn_send(std::ptr::null(), 16, 2, peer, c.comm, std::ptr::null_mut()),
                true => hccn_send(data.as_ptr().cast(), 16, 2, peer, c.comm, std::ptr::null_mut()),
                false => hccn_recv(ptr, 16, 2, peer, c.comm, std::ptr::null_mut()),
            }
        };
        // A refused receive drops the frame; a receive of a refused send fails: nobody succeeds
        // with another message's data.
        let want: &[u32] = match (sends, bad, bad_sender) {
            (_, true, _) => &[NULL],
            (true, false, _) => &[0],
            (false, false, true) => &[MISMATCH],
            (false, false, false) => &[0],
        };
        // The next message pairs with the next receive.
        let next: Vec<i32> = (0..16).map(|j| j * 7 + name.len() as i32).collect();
        let mut after = vec![0i32; 16];
        // SAFETY: 16 int32 elements.
        let sent = check(unsafe {
            match sends {
                true => hccn_send(next.as_ptr().cast(), 16, 2, peer, c.comm, std::ptr::null_mut()),
                false => hccn_recv(after.as_mut_ptr().cast(), 16, 2, peer, c.comm, std::ptr::null_mut()),
            }
        });
        let paired = sent.is_ok() && (sends || after == next);
        let ok = want.contains(&code) && paired;
        good &= ok;
        println!(
            "CASE p2p-{name} code={code} want={want:?} next={} {}",
            if paired { "ok" } else { "error" },
            if ok { "PASS" } else { "FAIL" }
        );
    }
    good
}

/// Calls refused before their arguments could be read (an unknown data type, a NULL counts
/// array) on the last rank, each on a fresh group of all ranks: the others get MISMATCH, and
/// the group works exactly after it (the refused round went where the others' small calls went).
fn unread(world: &CComm) -> bool {
    let (r, n) = (world.rank(), world.size());
    let bad = r == n - 1;
    let mut good = true;
    let ranks: Vec<u32> = (0..n).collect();
    for (i, kind) in ["allreduce", "allgatherv", "alltoallv", "broadcast"].into_iter().enumerate() {
        let mut g = std::ptr::null_mut();
        // SAFETY: a valid handle, list and out pointer.
        if check(unsafe { hccn_new_group(world.comm, ranks.as_ptr(), n, &mut g) }).is_err() {
            println!("CASE unread-{kind} group=failed FAIL");
            return false;
        }
        let g = CComm { comm: g };
        let (send, mut recv) = (vec![1f32; 64 * n as usize], vec![0f32; 64 * n as usize]);
        let counts = vec![4u64; n as usize];
        let displs: Vec<u64> = (0..n as u64).map(|i| 4 * i).collect();
        let (s, rv, c) = (send.as_ptr().cast::<c_void>(), recv.as_mut_ptr().cast::<c_void>(), g.comm);
        let dt = if bad && kind != "allgatherv" && kind != "alltoallv" { 99 } else { 4 };
        let cnt = if bad { std::ptr::null() } else { counts.as_ptr() };
        let null = std::ptr::null_mut();
        // SAFETY: every buffer holds more than the calls read or write.
        let code = unsafe {
            match kind {
                "allreduce" => hccn_allreduce(s, rv, 8, dt, 0, c, null),
                "allgatherv" => hccn_allgatherv(s, 4, rv, cnt, displs.as_ptr(), dt, c, null),
                "alltoallv" => {
                    hccn_alltoallv(s, cnt, displs.as_ptr(), rv, counts.as_ptr(), displs.as_ptr(), dt, c, null)
                }
                _ => hccn_broadcast(rv, 8, dt, 0, c, null),
            }
        };
        let want = match (bad, kind) {
            (false, _) => MISMATCH,
            (true, "allgatherv" | "alltoallv") => NULL,
            (true, _) => INVALID,
        };
        let salt = 1000.0 + i as f32;
        let next = match exact(&g, salt) {
            true => "ok",
            false if g.allreduce_f32(&send[..4], &mut recv[..4], 0).is_err() => "error",
            false => "WRONG",
        };
        let ok = code == want && next == "ok";
        good &= ok;
        println!("CASE unread-{kind} code={code} want=[{want}] next={next} {}", if ok { "PASS" } else { "FAIL" });
    }
    good
}

fn main() -> ExitCode {
    let c = match hccn_tests::capi::start_worker() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let n = c.size() as usize;
    let cap = (LARGE as usize) * n * 2;
    let mut bufs = Bufs { send: vec![1.0; cap], recv: vec![0.0; cap] };
    let good = collectives(&c, &mut bufs) & point_to_point(&c) & unread(&c);
    // Everyone is done before anyone destroys: a late rank's last case must not meet a goodbye.
    // SAFETY: a valid handle.
    let done = check(unsafe { hccn_barrier(c.comm, std::ptr::null_mut()) });
    if good && done.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
