//! A rank on the HCCL backend exercising what the backend does when the library lacks an
//! optional symbol (run with hccl-emu-minimal: docs/hccl.md): groups and splits get their HCCL
//! communicator from a fresh root info, allgatherv/scatter/alltoall are staged through host
//! memory, and a stream is waited for without `aclrtStreamQuery`. Every result is checked.
//! Prints `[r] FALLBACKS ok rank r of n` or `FAIL ...` lines.
//! Usage: HCCN_BACKEND=hccl HCCN_HCCL_LIB=.. HCCN_ACL_LIB=.. hccnrun -n N hccn-hccl-fallbacks

use std::process::ExitCode;

use hccn::*;
use hccn_runtime::{DataType, Op, Ptr, ReduceOp};
use hccn_tests::capi::{check, CComm};
use hccn_tests::Coll;

fn main() -> ExitCode {
    let world = match hccn_tests::capi::start_worker() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let (me, n) = (world.rank(), world.size());
    let mut fails = Vec::new();
    groups(&world, &mut fails);
    staged(&world, &mut fails);
    if let Err(e) = stream(&world) {
        fails.push(e);
    }
    for f in &fails {
        println!("FAIL rank {me}: {f}");
    }
    if fails.is_empty() {
        println!("FALLBACKS ok rank {me} of {n}");
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn f32s(p: &mut [f32]) -> Ptr {
    Ptr::from_mut(p.as_mut_ptr())
}

/// An fp32 sum allreduce of `rank + 1` on `c`, checked against `want`.
fn sum_check(c: &CComm, from: f32, want: f32, what: &str, fails: &mut Vec<String>) {
    let mut buf = vec![from; 1000];
    let p = f32s(&mut buf);
    // SAFETY: `buf` outlives the blocking call.
    match unsafe { c.run(Op::AllReduce { send: p, recv: p, count: 1000, dt: DataType::Fp32, op: ReduceOp::Sum }) } {
        Ok(()) if buf.iter().all(|v| *v == want) => {}
        Ok(()) => fails.push(format!("{what}: allreduce gave {}, want {want}", buf[0])),
        Err((code, msg)) => fails.push(format!("{what}: allreduce returned {code}: {msg}")),
    }
}

fn groups(world: &CComm, fails: &mut Vec<String>) {
    let (me, n) = (world.rank(), world.size());
    // hccn_new_group of the even ranks.
    let even: Vec<u32> = (0..n).step_by(2).collect();
    if me % 2 == 0 {
        let mut g = std::ptr::null_mut();
        // SAFETY: valid handle, array and out pointer.
        match check(unsafe { hccn_new_group(world.comm, even.as_ptr(), even.len() as u32, &mut g) }) {
            Ok(()) => {
                let g = CComm { comm: g };
                if (g.rank(), g.size()) != (me / 2, even.len() as u32) {
                    fails.push(format!("new_group: rank {} of {}", g.rank(), g.size()));
                }
                let want: f32 = even.iter().map(|r| (r + 1) as f32).sum();
                sum_check(&g, (me + 1) as f32, want, "new_group(even)", fails);
            }
            Err((code, msg)) => fails.push(format!("new_group(even) returned {code}: {msg}")),
        }
    }
    // hccn_comm_split by parity, reversed order.
    let mut s = std::ptr::null_mut();
    // SAFETY: valid handle and out pointer.
    match check(unsafe { hccn_comm_split(world.comm, (me % 2) as i32, -(me as i32), &mut s) }) {
        Ok(()) if s.is_null() => fails.push("split gave no communicator".into()),
        Ok(()) => {
            let s = CComm { comm: s };
            let members: Vec<u32> = (0..n).filter(|r| r % 2 == me % 2).collect();
            let want_rank = members.iter().filter(|&&r| r > me).count() as u32;
            if (s.rank(), s.size()) != (want_rank, members.len() as u32) {
                fails.push(format!("split: rank {} of {}, want {want_rank} of {}", s.rank(), s.size(), members.len()));
            }
            let want: f32 = members.iter().map(|r| (r + 1) as f32).sum();
            sum_check(&s, (me + 1) as f32, want, "split(parity)", fails);
        }
        Err((code, msg)) => fails.push(format!("split returned {code}: {msg}")),
    }
}

/// allgatherv, scatter and alltoall with values that identify sender and position.
fn staged(world: &CComm, fails: &mut Vec<String>) {
    let (me, n) = (world.rank(), world.size() as usize);
    let val = |r: usize, i: usize| (r * 1000 + i) as f32;
    // allgatherv: rank r sends r + 1 elements, gathered in reverse rank order with a gap.
    let counts: Vec<u64> = (0..n as u64).map(|r| r + 1).collect();
    let mut displs = vec![0u64; n];
    let mut at = 0;
    for r in (0..n).rev() {
        displs[r] = at;
        at += counts[r] + 1;
    }
    let mut send: Vec<f32> = (0..=me as usize).map(|i| val(me as usize, i)).collect();
    let mut recv = vec![-1f32; at as usize];
    let op = Op::AllGatherV {
        send: f32s(&mut send),
        send_count: me as u64 + 1,
        recv: f32s(&mut recv),
        recv_counts: counts.clone(),
        displs: displs.clone(),
        dt: DataType::Fp32,
    };
    // SAFETY: buffers sized for the op, alive across the blocking call.
    match unsafe { world.run(op) } {
        Ok(()) => {
            for r in 0..n {
                for i in 0..=r {
                    let got = recv[displs[r] as usize + i];
                    if got != val(r, i) {
                        fails.push(format!("allgatherv: block {r} element {i} is {got}"));
                        break;
                    }
                }
            }
        }
        Err((code, msg)) => fails.push(format!("allgatherv returned {code}: {msg}")),
    }
    // scatter from the last rank, 7 elements each.
    let root = n - 1;
    let mut send: Vec<f32> = (0..7 * n).map(|i| val(root, i)).collect();
    let mut recv = vec![-1f32; 7];
    let op = Op::Scatter {
        send: f32s(&mut send),
        recv: f32s(&mut recv),
        recv_count: 7,
        dt: DataType::Fp32,
        root: root as u32,
    };
    // SAFETY: as above.
    match unsafe { world.run(op) } {
        Ok(()) if (0..7).all(|i| recv[i] == val(root, me as usize * 7 + i)) => {}
        Ok(()) => fails.push(format!("scatter: got {recv:?}")),
        Err((code, msg)) => fails.push(format!("scatter returned {code}: {msg}")),
    }
    // alltoall, 5 elements per rank: block j of rank r's send goes to rank j.
    let mut send: Vec<f32> = (0..5 * n).map(|i| val(me as usize, i)).collect();
    let mut recv = vec![-1f32; 5 * n];
    let op = Op::AllToAll { send: f32s(&mut send), recv: f32s(&mut recv), count_per_rank: 5, dt: DataType::Fp32 };
    // SAFETY: as above.
    match unsafe { world.run(op) } {
        Ok(()) => {
            for r in 0..n {
                for i in 0..5 {
                    if recv[r * 5 + i] != val(r, me as usize * 5 + i) {
                        fails.push(format!("alltoall: block {r} element {i} is {}", recv[r * 5 + i]));
                        break;
                    }
                }
            }
        }
        Err((code, msg)) => fails.push(format!("alltoall returned {code}: {msg}")),
    }
}

/// An HCCL allreduce on an hccn stream and a query, then an event, a staged alltoall and
/// synchronisation.
fn stream(world: &CComm) -> Result<(), String> {
    let (me, n) = (world.rank(), world.size() as usize);
    let mut s = std::ptr::null_mut();
    // SAFETY: valid out pointer.
    check(unsafe { hccn_stream_create(&mut s) }).map_err(|(c, m)| format!("stream_create returned {c}: {m}"))?;
    let mut ev = std::ptr::null_mut();
    // SAFETY: valid out pointer.
    check(unsafe { hccn_event_create(&mut ev) }).map_err(|(c, m)| format!("event_create returned {c}: {m}"))?;
    let mut buf = vec![(me + 1) as f32; 4096];
    let send: Vec<f32> = (0..3 * n).map(|i| (me as usize * 100 + i) as f32).collect();
    let mut recv = vec![-1f32; 3 * n];
    let mut out = Vec::new();
    // SAFETY: every buffer outlives the stream's work (synchronised below before they drop).
    unsafe {
        let p = buf.as_mut_ptr().cast();
        out.push(("allreduce", hccn_allreduce(p, p, 4096, 4, 0, world.comm, s)));
        // Only ACL work is queued: the query waits for it (no aclrtStreamQuery) and says done.
        out.push(("stream_query", hccn_stream_query(s)));
        out.push(("event_record", hccn_event_record(ev, s)));
        out.push(("alltoall", hccn_alltoall(send.as_ptr().cast(), recv.as_mut_ptr().cast(), 3, 4, world.comm, s)));
        out.push(("event_synchronize", hccn_event_synchronize(ev)));
        out.push(("stream_synchronize", hccn_stream_synchronize(s)));
        out.push(("event_destroy", hccn_event_destroy(ev)));
        out.push(("stream_destroy", hccn_stream_destroy(s)));
    }
    let mut errs: Vec<String> =
        out.iter().filter(|(_, rc)| *rc != 0).map(|(w, rc)| format!("{w} returned {rc}")).collect();
    let want: f32 = (1..=n as u32).map(|r| r as f32).sum();
    if buf.iter().any(|v| *v != want) {
        errs.push(format!("stream allreduce gave {}, want {want}", buf[0]));
    }
    if (0..n).any(|r| (0..3).any(|i| recv[r * 3 + i] != (r * 100 + me as usize * 3 + i) as f32)) {
        errs.push(format!("stream alltoall gave {recv:?}"));
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("; "))
    }
}
