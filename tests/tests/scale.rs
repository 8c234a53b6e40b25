//! Jobs of many ranks on this one machine over TCP (`HCCN_TRANSPORT=tcp`): every rank starts,
//! barriers, reduces (checked) and stops, none is declared failed, and a rank's threads do not
//! grow with the number of its peers (one progress thread reads every link).
//!
//! The jobs run one at a time (`SERIAL`): two large jobs at once on a 2-core machine would test
//! the scheduler, not the runtime.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use hccn_tests::launch::{self, Outcome};

static SERIAL: Mutex<()> = Mutex::new(());

fn probe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_hccn-scale"))
}

/// What one rank reported: its threads and descriptors while the communicator was alive.
#[derive(Debug, Clone, Copy)]
struct Report {
    threads: usize,
    fds: usize,
}

/// The value of `word=` in `line`.
fn value(line: &str, word: &str) -> Option<usize> {
    let start = line.find(&format!("{word}="))? + word.len() + 1;
    line[start..].split_whitespace().next()?.parse().ok()
}

/// Runs the probe on `n` ranks over TCP with a hard timeout; asserts a clean job (exit 0, every
/// rank reported, no rank declared failed) and returns rank 0's report.
fn clean_job(n: u32, env: &[(&str, &str)], timeout: Duration) -> Report {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut all_env = vec![("HCCN_TRANSPORT", "tcp")];
    all_env.extend_from_slice(env);
    let out = launch::hccnrun(n, &probe(), &[], &all_env, timeout);
    check_clean(n, &out);
    let prefix = format!("[0] rank 0 of {n}: SCALE ");
    let line = out.stdout.lines().find(|l| l.starts_with(&prefix)).unwrap_or_default();
    let report = value(line, "threads").zip(value(line, "fds")).map(|(threads, fds)| Report { threads, fds });
    let report = report.unwrap_or_else(|| panic!("rank 0 gave no counts: {}", out.describe()));
    eprintln!("{n} ranks over TCP: job {:?}, rank 0 {report:?}", out.elapsed);
    report
}

fn check_clean(n: u32, out: &Outcome) {
    assert_eq!(out.code, Some(0), "a job of {n} ranks over TCP failed: {}", out.describe());
    for r in 0..n {
        let want = format!("[{r}] rank {r} of {n}: SCALE ");
        assert!(out.stdout.contains(&want), "rank {r} of {n} did not report: {}", out.describe());
    }
    let all = format!("{}{}", out.stdout, out.stderr);
    for sign in ["FAIL", "peer failed", "silent for", "declared this rank dead"] {
        assert!(!all.contains(sign), "{sign:?} in a job of {n} ranks that lost none: {}", out.describe());
    }
}

/// Threads a rank may hold at any size: main, watchdog, progress engine, and a few to spare.
const MAX_THREADS: usize = 8;

#[test]
fn a_rank_holds_as_many_threads_with_63_peers_as_with_7_and_no_more_than_8() {
    let small = clean_job(8, &[], Duration::from_secs(20));
    let large = clean_job(64, &[], Duration::from_secs(40));
    assert_eq!(small.threads, large.threads, "threads grew with the job: 8 ranks {small:?}, 64 ranks {large:?}");
    assert!(large.threads <= MAX_THREADS, "rank 0 of 64 holds {} threads", large.threads);
    // One descriptor per peer (its link), not two: the engine reads the link's own socket.
    assert!(large.fds < small.fds + 2 * 56, "descriptors per peer: 8 ranks {small:?}, 64 ranks {large:?}");
}

#[test]
fn a_job_of_128_ranks_over_tcp_starts_reduces_and_stops_with_no_false_failure() {
    // Every rank still heartbeats every peer (127 links, 10 beats a second each, and as many
    // pulses): on 2 loaded cores a rank's watchdog can lag past the default 800 ms and declare a
    // live peer dead. That load is the failure-detection part of issue 30, not the transport's;
    // until it lands this job allows 3 s of silence.
    let report = clean_job(128, &[("HCCN_DEAD_AFTER_MS", "3000")], Duration::from_secs(45));
    assert!(report.threads <= MAX_THREADS, "rank 0 of 128 holds {} threads", report.threads);
}
