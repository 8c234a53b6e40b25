//! A rank that runs out of file descriptors while its links open on demand, for one rank of a
//! job started by hccnrun with HCCN_FULL_MESH_UP_TO=0 (every link beyond the watched ones opens
//! on its first message). Rank 1 lowers its open-file limit to what it holds and makes an
//! alltoall, which needs a link it does not have: its call must fail as its own shortage
//! (never RANK_FAILED naming a healthy peer); every rank's call fails, and no rank holds any
//! other failed. Rank 1 then raises its limit again and the next alltoall succeeds everywhere
//! with exact data: nobody was evicted. Prints `FIRST code=<c> failed=<ranks> msg=<m>` and
//! `SECOND <ok|...>`.

use std::ffi::c_void;
use std::process::ExitCode;

use hccn::*;
use hccn_tests::capi::{check, CComm};
use hccn_tests::Coll;

const SHORT_RANK: u32 = 1;
const PER_RANK: usize = 1024;

/// Sets the soft open-file limit; returns the one before.
fn set_nofile(soft: u64) -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain get/setrlimit on a local struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        let before = lim.rlim_cur;
        lim.rlim_cur = soft.min(lim.rlim_max);
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        before
    }
}

/// Lowers the limit to the highest descriptor held, and fills every free number below it, so
/// that the next socket this process opens fails with EMFILE. Returns the filler descriptors.
fn run_out() -> (u64, Vec<i32>) {
    let held: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default();
    let top = held.iter().copied().max().unwrap_or(2) as u64;
    let before = set_nofile(top + 1);
    let mut fillers = Vec::new();
    loop {
        // SAFETY: a plain open of /dev/null.
        let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            break;
        }
        fillers.push(fd);
    }
    (before, fillers)
}

fn alltoall(c: &CComm, salt: f32) -> Result<bool, (u32, String)> {
    let (r, n) = (c.rank() as usize, c.size() as usize);
    let send: Vec<f32> = (0..n * PER_RANK).map(|i| salt + (r * n * PER_RANK + i) as f32).collect();
    let mut recv = vec![0f32; n * PER_RANK];
    // SAFETY: buffers of n blocks of PER_RANK floats each.
    check(unsafe {
        hccn_alltoall(
            send.as_ptr().cast::<c_void>(),
            recv.as_mut_ptr().cast::<c_void>(),
            PER_RANK as u64,
            4, // HCCN_FP32
            c.comm,
            std::ptr::null_mut(),
        )
    })?;
    // Block j came from rank j: its element i was salt + (j*n*PER_RANK + r*PER_RANK + i).
    Ok((0..n)
        .all(|j| (0..PER_RANK).all(|i| recv[j * PER_RANK + i] == salt + (j * n * PER_RANK + r * PER_RANK + i) as f32)))
}

fn main() -> ExitCode {
    let c = match hccn_tests::capi::start_worker() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let short = c.rank() == SHORT_RANK;
    let filled = short.then(run_out);
    let first = alltoall(&c, 0.0);
    if let Some((before, fillers)) = filled {
        for fd in fillers {
            // SAFETY: descriptors this program opened.
            unsafe { libc::close(fd) };
        }
        set_nofile(before);
    }
    let (code, msg) = match &first {
        Ok(_) => (0, String::new()),
        Err((code, msg)) => (*code, msg.clone()),
    };
    println!("FIRST code={code} failed={:?} msg={msg}", c.failed_ranks());
    let second = alltoall(&c, 7.0);
    println!("SECOND {}", if second == Ok(true) { "ok".to_owned() } else { format!("{second:?}") });
    let healthy = c.failed_ranks().is_empty() && first.is_err();
    println!("END failed={:?}", c.failed_ranks());
    // Nobody leaves (which the others would see) before everyone has looked.
    // SAFETY: a valid handle.
    let done = check(unsafe { hccn_barrier(c.comm, std::ptr::null_mut()) });
    if healthy && second == Ok(true) && done.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
