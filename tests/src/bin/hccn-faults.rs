//! Fault scenarios for one rank of a job started by hccnrun, through the C ABI. Lines starting
//! with an upper-case word are read by tests/tests/faults.rs.
//!
//! - `kill`: the last rank SIGKILLs itself in the middle of a large allreduce; survivors must get
//!   HCCN_ERROR_RANK_FAILED naming it, and every later call must fail at once.
//! - `intruder`: while the job runs verified allreduces, rank 0 starts a process with the wrong
//!   job token, which must be refused with HCCN_ERROR_AUTH.
//! - `deadline`: rank 1 never joins an allreduce; rank 0 must get HCCN_ERROR_TIMEOUT.
//! - `early-exit`: rank 0 broadcasts and calls exit() without destroying its communicator; rank 1
//!   joins the broadcast later and must still get the data (an exit is not a failure).

use std::ffi::c_void;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hccn::*;
use hccn_tests::capi::{check, CComm};
use hccn_tests::Coll;

const FP32: u32 = 4;
const SUM: u32 = 0;

fn now_ms() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0)
}

fn allreduce(c: &CComm, send: &[f32], recv: &mut [f32]) -> Result<(), (u32, String)> {
    // SAFETY: both buffers hold `send.len()` floats and outlive the blocking call.
    check(unsafe {
        hccn_allreduce(
            send.as_ptr().cast::<c_void>(),
            recv.as_mut_ptr().cast(),
            send.len() as u64,
            FP32,
            SUM,
            c.comm,
            std::ptr::null_mut(),
        )
    })
}

fn failed_ranks(c: &CComm) -> Vec<u32> {
    let mut ranks = [0u32; 16];
    let mut count = 0u32;
    // SAFETY: capacity matches the array.
    unsafe { hccn_comm_failed_ranks(c.comm, ranks.as_mut_ptr(), 16, &mut count) };
    ranks[..count.min(16) as usize].to_vec()
}

fn kill(c: &CComm) -> ExitCode {
    let (me, n) = (c.rank(), c.size());
    let victim = n - 1;
    let send = vec![1.0f32; 16 << 20];
    let mut recv = vec![0.0f32; 16 << 20];
    println!("PID {}", std::process::id());
    if me == victim {
        std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            println!("KILL_AT {}", now_ms());
            // SAFETY: raising a signal at ourselves.
            unsafe { libc::raise(libc::SIGKILL) };
        });
    }
    for i in 0.. {
        if let Err((code, msg)) = allreduce(c, &send, &mut recv) {
            let at = now_ms();
            let failed = failed_ranks(c);
            println!("ERROR_AT {at} code={code} iteration={i} failed={failed:?} msg={msg}");
            // Later calls fail at once, without waiting for anything.
            let t = std::time::Instant::now();
            let again = allreduce(c, &send[..4], &mut recv[..4]).err().map(|e| e.0);
            let mut async_err = 0u32;
            // SAFETY: valid handle and out pointer.
            unsafe { hccn_comm_get_async_error(c.comm, &mut async_err) };
            println!("AFTER code={again:?} async={async_err} in_ms={}", t.elapsed().as_millis());
            let good = code == 100 && failed == vec![victim] && again == Some(100) && async_err == 100;
            return if good { ExitCode::SUCCESS } else { ExitCode::FAILURE };
        }
        if i > 1000 {
            break;
        }
    }
    println!("NO_ERROR");
    ExitCode::FAILURE
}

fn intruder_child() -> ExitCode {
    let t = std::time::Instant::now();
    match CComm::from_env() {
        Ok(_) => {
            println!("INTRUDER accepted");
            ExitCode::FAILURE
        }
        Err((code, msg)) => {
            println!("INTRUDER refused code={code} in_ms={} msg={msg}", t.elapsed().as_millis());
            if code == 104 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

fn intruder(c: &CComm) -> ExitCode {
    let (me, n) = (c.rank(), c.size());
    let mut child = None;
    if me == 0 {
        let exe = std::env::current_exe().expect("own path");
        let spawned = std::process::Command::new(exe)
            .arg("intruder-child")
            .env("HCCN_JOB_TOKEN", "not-the-job-token")
            .env("HCCN_RANK", "1")
            .env("HCCN_TIMEOUT_MS", "5000")
            .spawn();
        child = spawned.ok();
    }
    let send: Vec<f32> = (0..100_000).map(|j| (j % 7) as f32 + me as f32).collect();
    let mut recv = vec![0.0f32; send.len()];
    let mut wrong = 0usize;
    for _ in 0..40 {
        if let Err((code, msg)) = allreduce(c, &send, &mut recv) {
            println!("JOB_ERROR code={code} msg={msg}");
            return ExitCode::FAILURE;
        }
        let nf = n as f32;
        wrong +=
            recv.iter().enumerate().filter(|(j, v)| **v != nf * (*j % 7) as f32 + (n * (n - 1) / 2) as f32).count();
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("JOB_OK wrong={wrong}");
    if let Some(mut ch) = child {
        let st = ch.wait().map(|s| s.success()).unwrap_or(false);
        println!("INTRUDER_EXIT ok={st}");
        if !st {
            return ExitCode::FAILURE;
        }
    }
    if wrong == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn deadline(c: &CComm) -> ExitCode {
    let send = [1.0f32; 8];
    let mut recv = [0.0f32; 8];
    if c.rank() == 1 {
        // Stays alive (so this is not a failure) but never joins the collective.
        std::thread::sleep(Duration::from_millis(2500));
        return ExitCode::SUCCESS;
    }
    let t = std::time::Instant::now();
    let r = allreduce(c, &send, &mut recv);
    println!("DEADLINE code={:?} in_ms={}", r.as_ref().err().map(|e| e.0), t.elapsed().as_millis());
    if matches!(r, Err((9, _))) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn early_exit(c: &CComm) -> ExitCode {
    let mut buf: Vec<f32> = if c.rank() == 0 { (0..1000).map(|i| i as f32).collect() } else { vec![0.0; 1000] };
    if c.rank() != 0 {
        std::thread::sleep(Duration::from_millis(300));
    }
    // SAFETY: a live buffer of 1000 floats for the blocking call.
    let r = check(unsafe { hccn_broadcast(buf.as_mut_ptr().cast(), 1000, FP32, 0, c.comm, std::ptr::null_mut()) });
    if c.rank() == 0 {
        // exit() runs atexit hooks but no destructors: the communicator is never destroyed.
        std::process::exit(if r.is_ok() { 0 } else { 1 });
    }
    let good = r.is_ok() && buf.iter().enumerate().all(|(i, v)| *v == i as f32);
    println!("LATE_BROADCAST ok={good} result={:?}", r.err());
    if good {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn main() -> ExitCode {
    let mode = std::env::args().nth(1).unwrap_or_default();
    if mode == "intruder-child" {
        return intruder_child();
    }
    let comm = match CComm::from_env() {
        Ok(c) => c,
        Err((code, msg)) => {
            eprintln!("hccn_init_from_env failed with {code}: {msg}");
            return ExitCode::from(2);
        }
    };
    match mode.as_str() {
        "kill" => kill(&comm),
        "intruder" => intruder(&comm),
        "deadline" => deadline(&comm),
        "early-exit" => early_exit(&comm),
        other => {
            eprintln!("unknown mode {other:?}");
            ExitCode::from(2)
        }
    }
}
