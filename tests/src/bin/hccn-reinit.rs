//! Unique ids through the C ABI, for tests/tests/unique_ids.rs. Lines starting with an
//! upper-case word are read by the test.
//!
//! - `cycles RANKS N`: N times hccn_get_unique_id, hccn_comm_init_rank on RANKS threads, one
//!   checked allreduce, hccn_comm_destroy; prints this process's descriptors and threads
//!   (/proc/self/fd, /proc/self/task) after a warm-up and at the end.
//! - `reuse`: a unique id used again, after its communicator was destroyed (ranks 0.5 s apart),
//!   while it is still alive, and from another process after the store is gone: each must fail
//!   at once, clearly.
//! - `child HEX RANK NRANKS`: one rank of the id HEX in this process (for `reuse`).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use hccn::*;
use hccn_tests::capi::{check, CComm};

const FP32: u32 = 4;
const SUM: u32 = 0;

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

fn new_id() -> Result<hccn_unique_id, String> {
    let mut id = hccn_unique_id { internal: [0; 128] };
    // SAFETY: a valid out pointer.
    check(unsafe { hccn_get_unique_id(&mut id) }).map_err(|(c, m)| format!("get_unique_id: {c} {m}"))?;
    Ok(id)
}

fn init(id: &hccn_unique_id, rank: u32, n: u32) -> Result<CComm, (u32, String)> {
    let mut comm = std::ptr::null_mut();
    // SAFETY: valid out pointer and id.
    check(unsafe { hccn_comm_init_rank(&mut comm, n, id, rank) })?;
    Ok(CComm { comm })
}

/// One allreduce of each rank's number; true when the sum is right.
fn summed(c: &CComm, rank: u32, n: u32) -> bool {
    let send = [rank as f32 + 1.0];
    let mut recv = [0.0f32];
    // SAFETY: one live float each, for the blocking call.
    let r = unsafe {
        hccn_allreduce(send.as_ptr().cast(), recv.as_mut_ptr().cast(), 1, FP32, SUM, c.comm, std::ptr::null_mut())
    };
    r == 0 && recv[0] == (n * (n + 1) / 2) as f32
}

/// Every rank of a new communicator on its own thread: init, allreduce, destroy.
fn one_cycle(n: u32) -> Result<(), String> {
    let id = new_id()?;
    let outcomes: Vec<Result<(), String>> = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..n)
            .map(|r| {
                let id = &id;
                s.spawn(move || {
                    let c = init(id, r, n).map_err(|(code, m)| format!("rank {r}: init {code} {m}"))?;
                    if summed(&c, r, n) {
                        Ok(())
                    } else {
                        Err(format!("rank {r}: wrong sum"))
                    }
                })
            })
            .collect();
        ranks.into_iter().map(|t| t.join().unwrap_or_else(|_| Err("rank thread panicked".into()))).collect()
    });
    outcomes.into_iter().collect()
}

/// Descriptors and threads once counts have settled (ending connection threads finish).
fn settled() -> (usize, usize) {
    let mut last = (count("/proc/self/fd"), count("/proc/self/task"));
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(25));
        let now = (count("/proc/self/fd"), count("/proc/self/task"));
        if now == last {
            break;
        }
        last = now;
    }
    last
}

fn cycles(n: u32, total: usize) -> ExitCode {
    let warm_up = 20.min(total);
    let started = Instant::now();
    let mut first = (0, 0);
    for i in 0..total {
        if i == warm_up {
            first = settled();
        }
        if let Err(e) = one_cycle(n) {
            println!("FAILED cycle={i} {e}");
            return ExitCode::FAILURE;
        }
    }
    let last = settled();
    println!(
        "CYCLES ranks={n} n={total} fds={}->{} threads={}->{} secs={:.1}",
        first.0,
        last.0,
        first.1,
        last.1,
        started.elapsed().as_secs_f64()
    );
    ExitCode::SUCCESS
}

fn hex(id: &hccn_unique_id) -> String {
    id.internal.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<hccn_unique_id> {
    let mut id = hccn_unique_id { internal: [0; 128] };
    for (i, b) in id.internal.iter_mut().enumerate() {
        *b = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(id)
}

/// Prints how an init that must fail did: its code, time and message.
fn report(what: &str, started: Instant, r: Result<CComm, (u32, String)>) {
    let ms = started.elapsed().as_millis();
    match r {
        Ok(_) => println!("{what} code=0 ms={ms}"),
        Err((code, msg)) => println!("{what} code={code} ms={ms} msg={msg}"),
    }
}

fn reuse() -> ExitCode {
    let Ok(id) = new_id() else { return ExitCode::FAILURE };
    // Used once, destroyed; then both ranks try again, 0.5 s apart.
    if let Err(e) = std::thread::scope(|s| {
        let t = s.spawn(|| init(&id, 1, 2).map(|c| summed(&c, 1, 2)));
        let mine = init(&id, 0, 2).map(|c| summed(&c, 0, 2));
        match (mine, t.join()) {
            (Ok(true), Ok(Ok(true))) => Ok(()),
            other => Err(format!("first use: {other:?}")),
        }
    }) {
        println!("FAILED {e}");
        return ExitCode::FAILURE;
    }
    std::thread::scope(|s| {
        let late = s.spawn(|| {
            std::thread::sleep(Duration::from_millis(500));
            let t = Instant::now();
            report("AGAIN_AFTER_DESTROY rank=1", t, init(&id, 1, 2));
        });
        let t = Instant::now();
        report("AGAIN_AFTER_DESTROY rank=0", t, init(&id, 0, 2));
        let _ = late.join();
    });
    // Used again while its communicator lives.
    let Ok(id) = new_id() else { return ExitCode::FAILURE };
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let used = std::thread::scope(|s| {
        let id = &id;
        let other = s.spawn(move || {
            let c = init(id, 1, 2);
            // Alive until the main thread has tried again.
            let _ = done_rx.recv();
            c.is_ok()
        });
        let mine = init(id, 0, 2);
        if mine.is_ok() {
            let t = Instant::now();
            report("AGAIN_WHILE_ALIVE rank=0", t, init(id, 0, 2));
        }
        let _ = done_tx.send(());
        mine.is_ok() && other.join().unwrap_or(false)
    });
    if !used {
        println!("FAILED the second id's first use");
        return ExitCode::FAILURE;
    }
    // Another process holds the id: once here destroys, its store is gone for that process too.
    let Ok(id) = new_id() else { return ExitCode::FAILURE };
    let Ok(exe) = std::env::current_exe() else { return ExitCode::FAILURE };
    let child = std::process::Command::new(&exe).args(["child", &hex(&id), "1", "2"]).spawn();
    let Ok(mut child) = child else { return ExitCode::FAILURE };
    let here = init(&id, 0, 2).map(|c| summed(&c, 0, 2));
    let child_ok = child.wait().map(|s| s.success()).unwrap_or(false);
    println!("OTHER_PROCESS first_use={:?} child_ok={child_ok}", here.as_ref().map_err(|(c, _)| *c));
    let again = std::process::Command::new(&exe).args(["child", &hex(&id), "1", "2"]).status();
    println!("OTHER_PROCESS_AGAIN child_ok={}", again.map(|s| s.success()).unwrap_or(false));
    ExitCode::SUCCESS
}

fn child(args: &[String]) -> ExitCode {
    let (Some(id), Some(rank), Some(n)) = (
        args.first().and_then(|h| unhex(h)),
        args.get(1).and_then(|r| r.parse().ok()),
        args.get(2).and_then(|n| n.parse().ok()),
    ) else {
        return ExitCode::from(2);
    };
    let t = Instant::now();
    match init(&id, rank, n) {
        Ok(c) if summed(&c, rank, n) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            report("CHILD_INIT", t, Err(e));
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("cycles") => {
            let n = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(1);
            let total = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(100);
            cycles(n, total)
        }
        Some("reuse") => reuse(),
        Some("child") => child(&args[1..]),
        other => {
            eprintln!("unknown mode {other:?}: cycles RANKS N | reuse | child HEX RANK NRANKS");
            ExitCode::from(2)
        }
    }
}
