//! One rank of a scale probe under hccnrun, for tests/tests/scale.rs: init from the environment,
//! barrier, one checked allreduce (not with `--barrier-only`: then a rank leaves right after its
//! barrier, whose last signals may be a peer's first frames on a new link), then this process's
//! threads, descriptors and peak RSS (/proc/self/task, /proc/self/fd, VmHWM) while the
//! communicator is alive, then destroy.
//!
//! Prints `rank r of n: SCALE threads=T fds=F rss_mb=M` on success; `FAIL ...` and exit 1 otherwise.

use std::process::ExitCode;

use hccn::*;
use hccn_tests::capi::{check, start_worker};

const FP32: u32 = 4;
const SUM: u32 = 0;

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

/// Peak resident set of this process in MB (VmHWM), 0 when /proc does not say.
fn peak_rss_mb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
    kb.unwrap_or(0) / 1024
}

fn rank_and_size(comm: *mut hccn_comm) -> Result<(u32, u32), String> {
    let (mut rank, mut size) = (0u32, 0u32);
    // SAFETY: a live communicator and valid out pointers.
    check(unsafe { hccn_comm_rank(comm, &mut rank) }).map_err(|(c, m)| format!("comm_rank: {c} {m}"))?;
    // SAFETY: as above.
    check(unsafe { hccn_comm_size(comm, &mut size) }).map_err(|(c, m)| format!("comm_size: {c} {m}"))?;
    Ok((rank, size))
}

/// Barrier, then (unless `barrier_only`) an allreduce of a few numbers per rank checked against
/// the exact sum.
fn exercise(comm: *mut hccn_comm, rank: u32, n: u32, barrier_only: bool) -> Result<(), String> {
    // SAFETY: a live communicator; NULL stream means a blocking call.
    check(unsafe { hccn_barrier(comm, std::ptr::null_mut()) }).map_err(|(c, m)| format!("barrier: {c} {m}"))?;
    if barrier_only {
        return Ok(());
    }
    const COUNT: usize = 1024;
    let send: Vec<f32> = (0..COUNT).map(|i| (rank as usize + i % 7) as f32).collect();
    let mut recv = vec![0.0f32; COUNT];
    // SAFETY: live buffers of COUNT floats each, for the blocking call.
    let r = unsafe {
        hccn_allreduce(
            send.as_ptr().cast(),
            recv.as_mut_ptr().cast(),
            COUNT as u64,
            FP32,
            SUM,
            comm,
            std::ptr::null_mut(),
        )
    };
    check(r).map_err(|(c, m)| format!("allreduce: {c} {m}"))?;
    let ranks = (n as usize * (n as usize - 1) / 2) as f32;
    for (i, &got) in recv.iter().enumerate() {
        let want = ranks + (n as usize * (i % 7)) as f32;
        if got != want {
            return Err(format!("allreduce: element {i} is {got}, expected {want}"));
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let comm = match start_worker() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let barrier_only = std::env::args().any(|a| a == "--barrier-only");
    let outcome =
        rank_and_size(comm.comm).and_then(|(rank, n)| exercise(comm.comm, rank, n, barrier_only).map(|()| (rank, n)));
    match outcome {
        Ok((rank, n)) => {
            let (threads, fds) = (count("/proc/self/task"), count("/proc/self/fd"));
            println!("rank {rank} of {n}: SCALE threads={threads} fds={fds} rss_mb={}", peak_rss_mb());
            drop(comm);
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("FAIL {e}");
            ExitCode::FAILURE
        }
    }
}
