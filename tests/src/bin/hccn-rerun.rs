//! One rank of a job for the rerun tests in tests/tests/etcd.rs, through the C ABI. Lines
//! starting with an upper-case word are read by the tests.
//!
//! - `once`: joins the world, checks one allreduce, destroys the communicator, exits 0.
//! - `twice`: the same with two worlds one after the other.
//! - `hold`: joins, checks one allreduce, says READY and sleeps (to be killed).
//! - `exit`: joins, checks one allreduce, and exits 0 without destroying the communicator.

use std::process::ExitCode;
use std::time::Duration;

use hccn::*;
use hccn_tests::capi::{start_worker, CComm};
use hccn_tests::Coll;

const FP32: u32 = 4;
const SUM: u32 = 0;

/// An allreduce of each rank's number plus one; true when the sum is right.
fn summed(c: &CComm) -> bool {
    let (r, n) = (c.rank(), c.size());
    let send = [r as f32 + 1.0];
    let mut recv = [0.0f32];
    // SAFETY: one live float each, for the blocking call.
    let rc = unsafe {
        hccn_allreduce(send.as_ptr().cast(), recv.as_mut_ptr().cast(), 1, FP32, SUM, c.comm, std::ptr::null_mut())
    };
    rc == 0 && recv[0] == (n * (n + 1) / 2) as f32
}

fn world() -> Result<(), ExitCode> {
    let c = start_worker()?;
    let (r, n) = (c.rank(), c.size());
    if !summed(&c) {
        println!("FAIL rank={r} size={n}");
        return Err(ExitCode::FAILURE);
    }
    println!("DONE rank={r} size={n}");
    Ok(())
}

fn main() -> ExitCode {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let outcome = match mode.as_str() {
        "once" => world(),
        "twice" => world().and_then(|()| world()),
        "exit" => start_worker().and_then(|c| {
            let ok = summed(&c);
            println!("DONE rank={} size={}", c.rank(), c.size());
            std::process::exit(if ok { 0 } else { 1 })
        }),
        "hold" => start_worker().and_then(|c| {
            if !summed(&c) {
                return Err(ExitCode::FAILURE);
            }
            println!("READY rank={}", c.rank());
            std::thread::sleep(Duration::from_secs(120));
            Ok(())
        }),
        other => {
            eprintln!("unknown mode {other:?}: once | twice | hold | exit");
            Err(ExitCode::from(2))
        }
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(code) => code,
    }
}
