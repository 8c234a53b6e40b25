//! Fault scenarios for one rank of a job started by hccnrun, through the C ABI. Lines starting
//! with an upper-case word are read by tests/tests/faults.rs.
//!
//! - `kill` (`kill-small`, `kill-small-every-kind`, `kill-mid-every-kind`, `kill-large-every-kind`,
//!   `kill-huge-every-kind`): the last rank SIGKILLs itself in the middle of a run of 64-byte
//!   allreduces, or of collectives of every kind (64-byte ones take the shared-memory board,
//!   16 KiB blocks the messages with two-rank rooted calls crossing their data, 256 KiB blocks
//!   single-copy reads, 8 MiB blocks steps of more sends than `Sends` holds); survivors must get
//!   HCCN_ERROR_RANK_FAILED naming it, and every later call must fail at once.
//! - `intruder`: while the job runs verified allreduces, rank 0 starts a process with the wrong
//!   job token, which must be refused with HCCN_ERROR_AUTH.
//! - `deadline`: rank 1 never joins an allreduce; rank 0 must get HCCN_ERROR_TIMEOUT.
//! - `shrink VICTIMS`: the ranks listed (comma-separated) SIGKILL themselves at once mid-allreduce; survivors get RANK_FAILED naming
//!   it, shrink, and run exact allreduces on the new communicator (epoch 1, dense ranks).
//! - `chaos DELAY_US`: rank 3 dies mid-allreduce, then rank 0 dies DELAY_US into its shrink; the
//!   survivors shrink again while the result has a failed member, and end with 2 exact ranks.
//! - `freeze [huge|small]`: the last rank SIGSTOPs itself mid-allreduce (of 4 MiB, 32 MiB or
//!   4 KiB); survivors must declare it failed (on one host the kernel says at once that it is
//!   stopped), shrink, reduce exactly, then kill the stopped rank.
//! - `steady SECONDS`: exact 4 KiB allreduces for about SECONDS (rank 0's clock decides, in the
//!   data, so that every rank stops after the same call); no rank may fail.
//! - `freeze-dial DIALER`: in a world that connects on demand, the last rank SIGSTOPs itself after
//!   a barrier; rank DIALER, which has no link to it, then sends it a message: the dial (which
//!   the frozen process's kernel accepts, and nobody answers) must end with RANK_FAILED naming
//!   it once it is known lost, not at the dial's own timeout. The dialer then kills it.
//! - `grow` (under `hccnrun --elastic`): the last rank dies mid-allreduce; hccnrun starts a
//!   replacement, which joins; the survivors rebuild; all reduce exactly at epoch 1.
//! - `store-host-dies`: on a communicator made with hccn_get_unique_id (whose store lives in rank
//!   0's process), rank 0 dies mid-allreduce; the survivors shrink without any store and go on.
//! - `partition`: ranks train until the link between hosts is cut (a test does it); each side
//!   reports the other failed, then tries to rebuild: only a side that reaches the store can.
//! - `revoke`: rank 1 revokes the world; everyone's next allreduce fails with REVOKED; all shrink
//!   (nobody failed) and go on at epoch 1.
//! - `leave exit|destroy`: after a few allreduces the last rank calls exit() without destroying
//!   its communicator (a failure, as a crash), or destroys it and returns (a departure); the
//!   others' next allreduce fails at once naming it, and they shrink and go on.

use std::ffi::c_void;
use std::process::ExitCode;
use std::time::Duration;

use hccn::*;
use hccn_tests::capi::{check, now_ms, CComm};
use hccn_tests::Coll;

const FP32: u32 = 4;
const SUM: u32 = 0;

/// Call `i` of a run of small collectives of every kind (all on the shared-memory board), on
/// `elems` floats per rank: `send` holds n blocks, `recv` n blocks.
fn small_collective(c: &CComm, i: usize, elems: usize, send: &[f32], recv: &mut [f32]) -> Result<(), (u32, String)> {
    let (s, r, k) = (send.as_ptr().cast::<c_void>(), recv.as_mut_ptr().cast::<c_void>(), elems as u64);
    let null = std::ptr::null_mut();
    // SAFETY: both buffers hold n blocks of `elems` floats and outlive each blocking call.
    check(unsafe {
        match i % 9 {
            0 => hccn_allreduce(s, r, k, FP32, SUM, c.comm, null),
            1 => hccn_broadcast(r, k, FP32, 0, c.comm, null),
            2 => hccn_reduce(s, r, k, FP32, SUM, 0, c.comm, null),
            3 => hccn_allgather(s, r, k, FP32, c.comm, null),
            4 => hccn_reduce_scatter(s, r, k, FP32, SUM, c.comm, null),
            5 => hccn_alltoall(s, r, k, FP32, c.comm, null),
            6 => hccn_gather(s, r, k, FP32, 0, c.comm, null),
            7 => hccn_scatter(s, r, k, FP32, 0, c.comm, null),
            _ => hccn_barrier(c.comm, null),
        }
    })
}

fn allreduce(c: &CComm, send: &[f32], recv: &mut [f32]) -> Result<(), (u32, String)> {
    c.allreduce_f32(send, recv, SUM)
}

fn kill(c: &CComm, elems: usize, every_kind: bool) -> ExitCode {
    let (me, n) = (c.rank(), c.size());
    let victim = n - 1;
    let blocks = if every_kind { n as usize } else { 1 };
    let send = vec![1.0f32; elems * blocks];
    let mut recv = vec![0.0f32; elems * blocks];
    println!("PID {}", std::process::id());
    if me == victim {
        std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            println!("KILL_AT {}", now_ms());
            // SAFETY: raising a signal at ourselves.
            unsafe { libc::raise(libc::SIGKILL) };
        });
    }
    let started = std::time::Instant::now();
    for i in 0.. {
        let r = match every_kind {
            true => small_collective(c, i, elems, &send, &mut recv),
            false => allreduce(c, &send, &mut recv),
        };
        if let Err((code, msg)) = r {
            let at = now_ms();
            let failed = c.failed_ranks();
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
        // The victim dies 300 ms in: 10 s without an error is a failure.
        if started.elapsed() > Duration::from_secs(10) {
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

/// After three small allreduces, rank 2 stays in its own code for `late_ms` before the next
/// one, which the others are already in: each waiting rank prints `LATE code=<c> in_ms=<t> msg=<m>` (the error, or 0 when
/// rank 2 came before the deadline).
fn late(c: &CComm, late_ms: u64) -> ExitCode {
    let send = [1.0f32; 8];
    let mut recv = [0.0f32; 8];
    // A few calls first, as in a training loop (the first small collective also sets up the
    // shared memory that the later ones use).
    for _ in 0..3 {
        if allreduce(c, &send, &mut recv).is_err() {
            return ExitCode::FAILURE;
        }
    }
    if c.rank() == 2 {
        std::thread::sleep(Duration::from_millis(late_ms));
    }
    let t = std::time::Instant::now();
    let r = allreduce(c, &send, &mut recv);
    let (code, msg) = r.err().unwrap_or((0, String::new()));
    if c.rank() != 2 {
        println!("LATE code={code} in_ms={} msg={msg}", t.elapsed().as_millis());
    }
    // Nobody leaves before the others have their answer (a departure would be news of its own).
    std::thread::sleep(Duration::from_millis(500));
    ExitCode::SUCCESS
}

/// Exact allreduces on `c`: rank r contributes (j % 5) + r, so element j is n*(j%5) + n(n-1)/2.
fn verified_allreduces(c: &CComm, rounds: usize) -> Result<(), String> {
    let (me, n) = (c.rank(), c.size());
    let send: Vec<f32> = (0..10_000).map(|j| (j % 5) as f32 + me as f32).collect();
    let mut recv = vec![0f32; send.len()];
    for _ in 0..rounds {
        allreduce(c, &send, &mut recv).map_err(|(code, msg)| format!("allreduce returned {code}: {msg}"))?;
        let bad =
            recv.iter().enumerate().filter(|(j, v)| **v != (n * (*j as u32 % 5) + n * (n - 1) / 2) as f32).count();
        if bad > 0 {
            return Err(format!("{bad} wrong elements"));
        }
    }
    Ok(())
}

fn shrink_comm(c: &CComm) -> Result<CComm, (u32, String)> {
    let mut out = std::ptr::null_mut();
    // SAFETY: valid handle and out pointer.
    check(unsafe { hccn_comm_shrink(c.comm, &mut out) })?;
    Ok(CComm { comm: out })
}

fn shrink_after_kill(c: &CComm, victims: &[u32]) -> ExitCode {
    let (me, n) = (c.rank(), c.size());
    let send = vec![1.0f32; 4 << 20];
    let mut recv = vec![0.0f32; 4 << 20];
    // One wall-clock moment for every victim (rank 0 picks it), so they die within about a
    // millisecond of each other.
    let mut at = [now_ms() as u64 + 300];
    // SAFETY: `at` lives for the blocking call.
    unsafe {
        hccn_broadcast(at.as_mut_ptr().cast(), 1, 6 /* HCCN_UINT64 */, 0, c.comm, std::ptr::null_mut())
    };
    if victims.contains(&me) {
        std::thread::spawn(move || {
            while (now_ms() as u64) < at[0] {
                std::thread::sleep(Duration::from_micros(200));
            }
            println!("KILL_AT {}", now_ms());
            // SAFETY: raising a signal at ourselves.
            unsafe { libc::raise(libc::SIGKILL) };
        });
    }
    let mut err = None;
    for _ in 0..10_000 {
        if let Err(e) = allreduce(c, &send, &mut recv) {
            err = Some(e);
            break;
        }
    }
    let Some((code, _)) = err else {
        println!("NO_ERROR");
        return ExitCode::FAILURE;
    };
    println!("ERROR_AT {} code={code} failed={:?}", now_ms(), c.failed_ranks());
    let t = std::time::Instant::now();
    // Failures a few ms apart may be decided by two agreements: a shrunk communicator that still
    // holds a failed member fails its first operation, and the survivors shrink it again.
    let mut current = match shrink_comm(c) {
        Ok(s) => s,
        Err((code, msg)) => {
            println!("SHRINK_FAILED code={code} msg={msg}");
            return ExitCode::FAILURE;
        }
    };
    let mut result = verified_allreduces(&current, 50);
    while result.is_err() && current.epoch() < victims.len() as u64 {
        current = match shrink_comm(&current) {
            Ok(s) => s,
            Err((code, msg)) => {
                println!("SHRINK_FAILED code={code} msg={msg}");
                return ExitCode::FAILURE;
            }
        };
        result = verified_allreduces(&current, 50);
    }
    let shrink_ms = t.elapsed().as_millis();
    let expected_rank = me - victims.iter().filter(|&&v| v < me).count() as u32;
    println!(
        "SHRUNK rank={} size={} epoch={} in_ms={shrink_ms} result={result:?}",
        current.rank(),
        current.size(),
        current.epoch()
    );
    let good = current.size() == n - victims.len() as u32 && current.rank() == expected_rank && result.is_ok();
    if good {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Exact 4 KiB allreduces for about `seconds`: element 0 carries rank 0's "go on" (1 while
/// its clock says so, 0 from everyone else), so every rank stops after the same call.
fn steady(c: &CComm, seconds: u64) -> ExitCode {
    let (me, n) = (c.rank(), c.size());
    let start = std::time::Instant::now();
    let mut send: Vec<f32> = (0..1024).map(|j| (j % 7) as f32 + me as f32).collect();
    let mut recv = vec![0f32; send.len()];
    let expect = |j: usize| (n * (j as u32 % 7) + n * (n - 1) / 2) as f32;
    for round in 0u64.. {
        send[0] = (me == 0 && start.elapsed() < Duration::from_secs(seconds)) as u32 as f32;
        if let Err((code, msg)) = allreduce(c, &send, &mut recv) {
            println!("STEADY_FAILED round={round} at_ms={} code={code} msg={msg}", start.elapsed().as_millis());
            return ExitCode::FAILURE;
        }
        let bad = (1..recv.len()).filter(|&j| recv[j] != expect(j)).count();
        if bad > 0 {
            println!("STEADY_FAILED round={round} {bad} wrong elements");
            return ExitCode::FAILURE;
        }
        if recv[0] == 0.0 {
            println!("STEADY rounds={} ms={}", round + 1, start.elapsed().as_millis());
            return ExitCode::SUCCESS;
        }
    }
    ExitCode::FAILURE
}

/// Kills this job's stopped ranks: siblings (same parent, hccnrun) in state T.
fn kill_stopped_siblings() {
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // pid (comm) state ppid ...: comm may hold spaces, so parse after the last ')'.
        let fields: Vec<&str> =
            stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
        if fields.first() == Some(&"T") && fields.get(1).and_then(|p| p.parse::<i32>().ok()) == Some(parent) {
            // SAFETY: signalling a process of our own job.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// The last rank freezes amid allreduces of `elems` floats (8 Mi: ring steps of more chunks
/// than `Sends` holds, so senders wait for a frozen reader amid a step; 1 Ki: the board).
fn freeze(c: &CComm, elems: usize) -> ExitCode {
    let (me, n) = (c.rank(), c.size());
    let victim = n - 1;
    let send = vec![1.0f32; elems];
    let mut recv = vec![0.0f32; elems];
    if me == victim {
        std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            println!("FREEZE_AT {}", now_ms());
            // SAFETY: raising a signal at ourselves.
            unsafe { libc::raise(libc::SIGSTOP) };
        });
    }
    let err = loop {
        if let Err(e) = allreduce(c, &send, &mut recv) {
            break e;
        }
    };
    println!("ERROR_AT {} code={} failed={:?} msg={}", now_ms(), err.0, c.failed_ranks(), err.1);
    let small = match shrink_comm(c) {
        Ok(s) => s,
        Err((code, msg)) => {
            println!("SHRINK_FAILED code={code} msg={msg}");
            return ExitCode::FAILURE;
        }
    };
    let result = verified_allreduces(&small, 10);
    println!("SHRUNK size={} epoch={} result={result:?}", small.size(), small.epoch());
    if small.rank() == 0 {
        // SAFETY: a barrier has no buffers; both survivors are done before the frozen rank dies.
        unsafe { hccn_barrier(small.comm, std::ptr::null_mut()) };
        kill_stopped_siblings();
    }
    if err.0 == 100 && small.size() == n - 1 && result.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn freeze_dial(c: &CComm, dialer: u32) -> ExitCode {
    let (me, n) = (c.rank(), c.size());
    let victim = n - 1;
    // SAFETY: a barrier has no buffers.
    if let Err((code, msg)) = check(unsafe { hccn_barrier(c.comm, std::ptr::null_mut()) }) {
        println!("FAIL barrier code={code} msg={msg}");
        return ExitCode::FAILURE;
    }
    if me == victim {
        println!("FREEZE_AT {}", now_ms());
        // SAFETY: raising a signal at ourselves.
        unsafe { libc::raise(libc::SIGSTOP) };
        return ExitCode::SUCCESS;
    }
    if me != dialer {
        // SAFETY: as above; it ends with the frozen rank declared failed.
        let r = check(unsafe { hccn_barrier(c.comm, std::ptr::null_mut()) });
        println!("BYSTANDER {} {r:?}", now_ms());
        return ExitCode::SUCCESS;
    }
    std::thread::sleep(Duration::from_millis(100));
    let one = [1.0f32];
    // SAFETY: a live buffer of one float for the blocking call.
    let sent = check(unsafe { hccn_send(one.as_ptr().cast(), 1, FP32, victim, c.comm, std::ptr::null_mut()) });
    let (code, msg) = sent.err().unwrap_or((0, String::new()));
    println!("ERROR_AT {} code={code} failed={:?} msg={msg}", now_ms(), c.failed_ranks());
    kill_stopped_siblings();
    if code == 100 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn chaos(c: &CComm, delay_us: u64) -> ExitCode {
    let me = c.rank();
    let send = vec![1.0f32; 1 << 20];
    let mut recv = vec![0.0f32; 1 << 20];
    if me == 3 {
        std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(100));
            // SAFETY: raising a signal at ourselves.
            unsafe { libc::raise(libc::SIGKILL) };
        });
    }
    while allreduce(c, &send, &mut recv).is_ok() {}
    if me == 0 {
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_micros(delay_us));
            // SAFETY: raising a signal at ourselves.
            unsafe { libc::raise(libc::SIGKILL) };
        });
        // Rank 0 dies during its shrink or right after it, never later.
        let _ = shrink_comm(c);
        std::thread::sleep(Duration::from_secs(30));
        return ExitCode::FAILURE;
    }
    // Shrink until a communicator works: one that still holds a rank which died during the
    // agreement fails its first operation, and the survivors shrink again.
    let mut current = match shrink_comm(c) {
        Ok(s) => s,
        Err((code, msg)) => {
            println!("SHRINK_FAILED code={code} msg={msg}");
            return ExitCode::FAILURE;
        }
    };
    for _ in 0..3 {
        match verified_allreduces(&current, 5) {
            Ok(()) => {
                println!("SETTLED rank={} size={} epoch={}", current.rank(), current.size(), current.epoch());
                return if current.size() == 2 { ExitCode::SUCCESS } else { ExitCode::FAILURE };
            }
            Err(e) => println!("RETRY epoch={} size={} after {e}", current.epoch(), current.size()),
        }
        current = match shrink_comm(&current) {
            Ok(s) => s,
            Err((code, msg)) => {
                println!("SHRINK_FAILED code={code} msg={msg}");
                return ExitCode::FAILURE;
            }
        };
    }
    println!("NOT_SETTLED");
    ExitCode::FAILURE
}

fn store_host_dies(world: &CComm) -> ExitCode {
    let (me, n) = (world.rank(), world.size());
    let mut id = hccn_unique_id { internal: [0; 128] };
    if me == 0 {
        // SAFETY: valid out pointer; this process now hosts the new communicator's store.
        if unsafe { hccn_get_unique_id(&mut id) } != 0 {
            return ExitCode::FAILURE;
        }
    }
    // SAFETY: 128 live bytes, on every rank.
    unsafe {
        hccn_broadcast(
            id.internal.as_mut_ptr().cast(),
            128,
            7, /* HCCN_UINT8 */
            0,
            world.comm,
            std::ptr::null_mut(),
        )
    };
    let mut comm = std::ptr::null_mut();
    // SAFETY: valid out pointer and id.
    if let Err((code, msg)) = check(unsafe { hccn_comm_init_rank(&mut comm, n, &id, me) }) {
        println!("INIT_FAILED code={code} msg={msg}");
        return ExitCode::FAILURE;
    }
    let c = CComm { comm };
    if me == 0 {
        std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(150));
            // SAFETY: raising a signal at ourselves (and with us, the store).
            unsafe { libc::raise(libc::SIGKILL) };
        });
    }
    let send = vec![1.0f32; 1 << 16];
    let mut recv = vec![0.0f32; 1 << 16];
    while allreduce(&c, &send, &mut recv).is_ok() {}
    let small = match shrink_comm(&c) {
        Ok(s) => s,
        Err((code, msg)) => {
            println!("SHRINK_FAILED code={code} msg={msg}");
            return ExitCode::FAILURE;
        }
    };
    let result = verified_allreduces(&small, 10);
    println!("SHRUNK_WITHOUT_STORE size={} result={result:?}", small.size());
    if small.size() == n - 1 && result.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn partition(c: &CComm) -> ExitCode {
    let send = vec![1.0f32; 1 << 14];
    let mut recv = vec![0.0f32; 1 << 14];
    println!("TRAINING");
    let err = loop {
        if let Err(e) = allreduce(c, &send, &mut recv) {
            break e;
        }
    };
    println!("ERROR_AT {} code={} failed={:?}", now_ms(), err.0, c.failed_ranks());
    let mut out = std::ptr::null_mut();
    // SAFETY: valid handle and out pointer; no replacement is expected (timeout 0).
    match check(unsafe { hccn_comm_rebuild(c.comm, 0, &mut out) }) {
        Ok(()) => {
            let small = CComm { comm: out };
            let result = verified_allreduces(&small, 5);
            println!("REBUILT size={} epoch={} result={result:?}", small.size(), small.epoch());
        }
        Err((code, msg)) => println!("REBUILD_FAILED code={code} msg={msg}"),
    }
    ExitCode::SUCCESS
}

fn revoke_then_shrink(c: &CComm) -> ExitCode {
    let send = [1.0f32; 64];
    let mut recv = [0f32; 64];
    for _ in 0..3 {
        let _ = allreduce(c, &send, &mut recv);
    }
    if c.rank() == 1 {
        // SAFETY: valid handle.
        let r = unsafe { hccn_comm_revoke(c.comm) };
        println!("REVOKE returned {r}");
    }
    // Whatever a rank is doing when the revoke arrives fails with REVOKED: the allreduce it
    // may still be finishing, or the next one.
    let mut code = None;
    for _ in 0..2 {
        if let Err((c, _)) = allreduce(c, &send, &mut recv) {
            code = Some(c);
            break;
        }
    }
    println!("AFTER_REVOKE code={code:?}");
    let small = match shrink_comm(c) {
        Ok(s) => s,
        Err((code, msg)) => {
            println!("SHRINK_FAILED code={code} msg={msg}");
            return ExitCode::FAILURE;
        }
    };
    let result = verified_allreduces(&small, 5);
    println!("SHRUNK size={} epoch={} result={result:?}", small.size(), small.epoch());
    if code == Some(101) && small.size() == c.size() && small.epoch() == 1 && result.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn grow(c: CComm) -> ExitCode {
    let (me, n) = (c.rank(), c.size());
    let comm = if c.epoch() > 0 {
        println!("JOINED rank={me} size={n} epoch={}", c.epoch());
        c
    } else {
        if me == n - 1 {
            // TEST_KILL_DELAY_MS lets a test act (kill the etcd leader, say) while ranks train.
            let delay = std::env::var("TEST_KILL_DELAY_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(150);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(delay));
                // SAFETY: raising a signal at ourselves.
                unsafe { libc::raise(libc::SIGKILL) };
            });
        }
        let send = vec![1.0f32; 1 << 16];
        let mut recv = vec![0.0f32; 1 << 16];
        let err = loop {
            if let Err(e) = allreduce(&c, &send, &mut recv) {
                break e;
            }
        };
        println!("ERROR code={} failed={:?}", err.0, c.failed_ranks());
        let mut out = std::ptr::null_mut();
        // SAFETY: valid handle and out pointer.
        if let Err((code, msg)) = check(unsafe { hccn_comm_rebuild(c.comm, 20_000, &mut out) }) {
            println!("REBUILD_FAILED code={code} msg={msg}");
            return ExitCode::FAILURE;
        }
        CComm { comm: out }
    };
    let result = verified_allreduces(&comm, 10);
    println!("GROWN rank={} size={} epoch={} result={result:?}", comm.rank(), comm.size(), comm.epoch());
    if result.is_ok() && comm.size() == n && comm.epoch() == 1 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn leave(c: CComm, how: &str) -> ExitCode {
    let (me, n) = (c.rank(), c.size());
    if let Err(e) = verified_allreduces(&c, 3) {
        println!("BEFORE_LEAVING {e}");
        return ExitCode::FAILURE;
    }
    if me == n - 1 {
        // Not before the others are through the last allreduce too: a member that leaves amid
        // an operation fails it for everyone still in it (seen once, on a loaded machine).
        std::thread::sleep(Duration::from_millis(200));
        if how == "exit" {
            // exit() runs atexit hooks but no destructors: the communicator is never destroyed.
            std::process::exit(0);
        }
        drop(c);
        return ExitCode::SUCCESS;
    }
    std::thread::sleep(Duration::from_millis(600));
    let t = std::time::Instant::now();
    let send = vec![1.0f32; 1000];
    let mut recv = vec![0.0f32; 1000];
    let Err((code, msg)) = allreduce(&c, &send, &mut recv) else {
        println!("NO_ERROR");
        return ExitCode::FAILURE;
    };
    println!("LEFT code={code} failed={:?} in_ms={} msg={msg}", c.failed_ranks(), t.elapsed().as_millis());
    let small = match shrink_comm(&c) {
        Ok(s) => s,
        Err((code, msg)) => {
            println!("SHRINK_FAILED code={code} msg={msg}");
            return ExitCode::FAILURE;
        }
    };
    match verified_allreduces(&small, 20) {
        Ok(()) => {
            println!("SHRUNK size={} epoch={}", small.size(), small.epoch());
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("AFTER_SHRINK {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let mode = std::env::args().nth(1).unwrap_or_default();
    if mode == "intruder-child" {
        return intruder_child();
    }
    let comm = match hccn_tests::capi::start_worker() {
        Ok(c) => c,
        Err(code) => return code,
    };
    if mode == "grow" {
        return grow(comm);
    }
    match mode.as_str() {
        "kill" => kill(&comm, 16 << 20, false),
        "kill-small" => kill(&comm, 16, false),
        "kill-small-every-kind" => kill(&comm, 16, true),
        "kill-mid-every-kind" => kill(&comm, 4 << 10, true),
        "kill-large-every-kind" => kill(&comm, 64 << 10, true),
        "kill-huge-every-kind" => kill(&comm, 2 << 20, true),
        "intruder" => intruder(&comm),
        "deadline" => deadline(&comm),
        "late" => late(&comm, std::env::args().nth(2).and_then(|v| v.parse().ok()).unwrap_or(3000)),
        "leave" => leave(comm, &std::env::args().nth(2).unwrap_or_default()),
        "shrink" => {
            // Victims: a comma-separated list of ranks that die at the same moment.
            let list = std::env::args().nth(2).unwrap_or_else(|| "0".into());
            let victims: Vec<u32> = list.split(',').filter_map(|v| v.parse().ok()).collect();
            shrink_after_kill(&comm, &victims)
        }
        "revoke" => revoke_then_shrink(&comm),
        "freeze" => freeze(
            &comm,
            match std::env::args().nth(2).as_deref() {
                Some("huge") => 8 << 20,
                Some("small") => 1 << 10,
                _ => 1 << 20,
            },
        ),
        "steady" => steady(&comm, std::env::args().nth(2).and_then(|v| v.parse().ok()).unwrap_or(5)),
        "freeze-dial" => freeze_dial(&comm, std::env::args().nth(2).and_then(|v| v.parse().ok()).unwrap_or(2)),
        "partition" => partition(&comm),
        "store-host-dies" => store_host_dies(&comm),
        "chaos" => chaos(&comm, std::env::args().nth(2).and_then(|v| v.parse().ok()).unwrap_or(0)),
        other => {
            eprintln!("unknown mode {other:?}");
            ExitCode::from(2)
        }
    }
}
