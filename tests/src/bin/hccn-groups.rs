//! Group member lists that differ across ranks, for one rank of a job started by hccnrun:
//! `order` (rank 0 lists the members in reverse) must fail at creation with MISMATCH on every
//! rank, naming the ranks; `members` (rank 0 leaves the last rank out) must fail at creation on
//! every rank with MISMATCH long before the deadline, naming both lists; `extra` (the last rank
//! lists every rank, the others leave it out) makes the others' group, and the last rank fails
//! at the deadline, saying that the lists may differ. After `order`, a group of the same list on
//! every rank works. Prints `CASE <name> code=<c> ms=<t> msg=<m>`.

use std::process::ExitCode;

use hccn::*;
use hccn_tests::capi::{check, CComm};
use hccn_tests::Coll;

fn new_group(world: &CComm, ranks: &[u32]) -> Result<CComm, (u32, String)> {
    let mut out = std::ptr::null_mut();
    // SAFETY: a valid handle, list and out pointer.
    check(unsafe { hccn_new_group(world.comm, ranks.as_ptr(), ranks.len() as u32, &mut out) })?;
    Ok(CComm { comm: out })
}

fn main() -> ExitCode {
    let world = match hccn_tests::capi::start_worker() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let (r, n) = (world.rank(), world.size());
    let all: Vec<u32> = (0..n).collect();
    let case = std::env::args().nth(1).unwrap_or_default();
    let mine: Vec<u32> = match (case.as_str(), r) {
        ("order", 0) => all.iter().rev().copied().collect(),
        ("members", 0) => all[..n as usize - 1].to_vec(),
        ("extra", r) if r + 1 < n => all[..n as usize - 1].to_vec(),
        _ => all.clone(),
    };
    let t = std::time::Instant::now();
    let got = if mine.contains(&r) { new_group(&world, &mine).map(drop) } else { Ok(()) };
    let (code, msg) = got.err().unwrap_or((0, String::new()));
    println!("CASE {case} code={code} ms={} msg={msg}", t.elapsed().as_millis());
    if case == "members" || case == "extra" {
        // Ranks whose member sets differed may number later groups of the set differently; the
        // world still works (and nobody leaves before everyone has failed on its own).
        // SAFETY: a valid handle.
        let done = check(unsafe { hccn_barrier(world.comm, std::ptr::null_mut()) });
        return if done.is_ok() { ExitCode::SUCCESS } else { ExitCode::FAILURE };
    }
    // The job goes on: a group of one list on every rank.
    let after = new_group(&world, &all).and_then(|g| {
        let (send, mut recv) = ([1f32; 4], [0f32; 4]);
        g.allreduce_f32(&send, &mut recv, 0)?;
        Ok(recv == [n as f32; 4])
    });
    println!("AFTER {case} {after:?}");
    if after == Ok(true) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
