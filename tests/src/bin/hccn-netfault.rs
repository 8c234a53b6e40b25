//! A training-like loop for network-fault tests (tests/tests/network_faults.rs), one rank of a
//! job started by hccnrun, through the C ABI: checked allreduces of 1 MiB and of 4 bytes until
//! SECONDS have passed, shrinking on every error and going on with the survivors. Lines
//! starting with an upper-case word are read by the tests; times are wall-clock ms.
//!
//! - `ERROR at=MS code=C failed=[..] msg=..`: an operation failed.
//! - `SHRUNK at=MS size=N epoch=E`: the survivors agreed and go on.
//! - `OUT at=MS code=C msg=..`: this rank is left out (stale epoch, lost quorum); it stops.
//! - `DONE size=N epoch=E ops=K wrong=W`: the loop ended; W elements were wrong.
//!
//! For the chaos bench (benches/chaos.sh): SIGUSR1 makes the rank exit without destroying its
//! communicator at its next step; SIGUSR2 makes its next 1 MiB allreduce count one element more
//! than the others' (a mismatched call).

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hccn::*;
use hccn_tests::capi::{check, now_ms, CComm};
use hccn_tests::Coll;

const SUM: u32 = 0;
const MAX: u32 = 2;
const LARGE: usize = 1 << 18;

static EXIT: AtomicBool = AtomicBool::new(false);
static MISMATCH: AtomicBool = AtomicBool::new(false);

/// This process's rank when the job started: hccnrun relabels a rank's lines when a shrink
/// renumbers it (and `[left]` once it is left out), so every line names it.
static LAUNCH_RANK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

/// Prints a line ending in ` launch_rank=R`.
macro_rules! say {
    ($($arg:tt)*) => {
        println!("{} launch_rank={}", format_args!($($arg)*), LAUNCH_RANK.get().copied().unwrap_or(u32::MAX))
    };
}

extern "C" fn on_signal(sig: libc::c_int) {
    match sig {
        libc::SIGUSR1 => EXIT.store(true, Ordering::SeqCst),
        _ => MISMATCH.store(true, Ordering::SeqCst),
    }
}

/// One step: a 4-byte allreduce that also says whether any rank wants to stop, then a checked
/// 1 MiB one. `Ok(None)`: go on; `Ok(Some(wrong))`: stop.
fn step(c: &CComm, stop: bool, wrong: &mut u64) -> Result<bool, (u32, String)> {
    let (r, n) = (c.rank() as f32, c.size() as usize);
    let mut flag = [0f32];
    c.allreduce_f32(&[if stop { 1.0 } else { 0.0 }], &mut flag, MAX)?;
    if flag[0] > 0.0 {
        return Ok(true);
    }
    if EXIT.load(Ordering::SeqCst) {
        say!("EXIT at={}", now_ms());
        // exit() runs no destructors: the communicator is never destroyed.
        std::process::exit(0);
    }
    let count = if MISMATCH.swap(false, Ordering::SeqCst) { LARGE + 1 } else { LARGE };
    let send: Vec<f32> = (0..count).map(|j| (j % 7) as f32 + r).collect();
    let mut recv = vec![0f32; count];
    c.allreduce_f32(&send, &mut recv, SUM)?;
    let want = |j: usize| (n * (j % 7) + n * (n - 1) / 2) as f32;
    *wrong += recv.iter().enumerate().filter(|(j, v)| **v != want(*j)).count() as u64;
    let mut small = [0f32];
    c.allreduce_f32(&[r + 1.0], &mut small, SUM)?;
    if small[0] != (n * (n + 1) / 2) as f32 {
        *wrong += 1;
    }
    Ok(false)
}

fn shrink(c: &CComm) -> Result<CComm, (u32, String)> {
    let mut out = std::ptr::null_mut();
    // SAFETY: valid handle and out pointer.
    check(unsafe { hccn_comm_shrink(c.comm, &mut out) })?;
    Ok(CComm { comm: out })
}

fn main() -> ExitCode {
    let seconds: u64 = std::env::args().nth(1).and_then(|v| v.parse().ok()).unwrap_or(10);
    let Ok(mut comm) = hccn_tests::capi::start_worker() else { return ExitCode::from(2) };
    let _ = LAUNCH_RANK.set(comm.rank());
    let end = Instant::now() + Duration::from_secs(seconds);
    let (mut ops, mut wrong) = (0u64, 0u64);
    // SAFETY: the handler only stores to atomics.
    unsafe {
        libc::signal(libc::SIGUSR1, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGUSR2, on_signal as *const () as libc::sighandler_t);
    }
    say!("START at={} pid={}", now_ms(), std::process::id());
    loop {
        match step(&comm, Instant::now() >= end, &mut wrong) {
            Ok(true) => break,
            Ok(false) => ops += 1,
            Err((code, msg)) => {
                say!("ERROR at={} code={code} failed={:?} msg={msg}", now_ms(), comm.failed_ranks());
                // Shrink until the survivors agree, or this rank is left out.
                comm = loop {
                    match shrink(&comm) {
                        Ok(s) => {
                            say!("SHRUNK at={} size={} epoch={}", now_ms(), s.size(), s.epoch());
                            break s;
                        }
                        Err((code @ 106, msg)) => {
                            say!("OUT at={} code={code} msg={msg}", now_ms());
                            return ExitCode::SUCCESS;
                        }
                        Err((code, msg)) => {
                            say!("SHRINK_ERROR at={} code={code} msg={msg}", now_ms());
                            if Instant::now() >= end + Duration::from_secs(20) {
                                return ExitCode::FAILURE;
                            }
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                };
            }
        }
    }
    say!("DONE size={} epoch={} ops={ops} wrong={wrong}", comm.size(), comm.epoch());
    ExitCode::SUCCESS
}
