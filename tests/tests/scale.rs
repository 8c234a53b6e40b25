//! Jobs of many ranks on this one machine over TCP (`HCCN_TRANSPORT=tcp`) and over shared memory:
//! every rank starts, barriers, reduces (checked) and stops, none is declared failed, and a rank's
//! threads and memory do not grow with the number of its peers (one progress thread reads every
//! link; shared-memory rings take memory only where used); a rank killed among 128 or frozen among
//! 64 is reported by every survivor, naming it alone.
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

/// What one rank reported: its threads and descriptors while the communicator was alive, and
/// its peak resident memory.
#[derive(Debug, Clone, Copy)]
struct Report {
    threads: usize,
    fds: usize,
    rss_mb: usize,
}

/// The value of `word=` in `line`.
fn value(line: &str, word: &str) -> Option<usize> {
    let start = line.find(&format!("{word}="))? + word.len() + 1;
    line[start..].split_whitespace().next()?.parse().ok()
}

/// Runs the probe on `n` ranks over TCP with a hard timeout; asserts a clean job (exit 0, every
/// rank reported, no rank declared failed) and returns rank 0's report.
fn clean_job(n: u32, env: &[(&str, &str)], timeout: Duration) -> Report {
    clean_job_over("tcp", n, env, timeout)
}

fn clean_job_over(transport: &str, n: u32, env: &[(&str, &str)], timeout: Duration) -> Report {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut all_env = vec![("HCCN_TRANSPORT", transport)];
    all_env.extend_from_slice(env);
    let out = launch::hccnrun(n, &probe(), &[], &all_env, timeout);
    check_clean(n, &out);
    let prefix = format!("[0] rank 0 of {n}: SCALE ");
    let line = out.stdout.lines().find(|l| l.starts_with(&prefix)).unwrap_or_default();
    let report = (value(line, "threads"), value(line, "fds"), value(line, "rss_mb"));
    let report = match report {
        (Some(threads), Some(fds), Some(rss_mb)) => Report { threads, fds, rss_mb },
        _ => panic!("rank 0 gave no counts: {}", out.describe()),
    };
    eprintln!("{n} ranks over {transport}: job {:?}, rank 0 {report:?}", out.elapsed);
    report
}

fn check_clean(n: u32, out: &Outcome) {
    assert_eq!(out.code, Some(0), "a job of {n} ranks failed: {}", out.describe());
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
    // Default HCCN_DEAD_AFTER_MS (800): each rank heartbeats only the 2k peers it watches.
    let report = clean_job(128, &[], Duration::from_secs(45));
    assert!(report.threads <= MAX_THREADS, "rank 0 of 128 holds {} threads", report.threads);
}

/// In a barrier of a world that connects on demand, a rank's last signal may be its first frame
/// to that peer: it dials, sends, leaves and closes its listener, while the peer, waiting for
/// that signal, dials it too and finds nothing listening. The peer's acceptor has kept the
/// leaver's connection by then, with the signal and the goodbye on it: the wait takes the
/// signal instead of reporting that the leaver left (one job in two of 128 ranks failed so).
#[test]
fn a_rank_that_leaves_right_after_its_last_signal_on_a_new_link_is_not_taken_for_gone() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let env = [("HCCN_TRANSPORT", "tcp"), ("HCCN_FULL_MESH_UP_TO", "0")];
    // Before the fix one job in four failed (2 of 8 here, and the first of these 16 when the
    // fix was taken out): 16 clean jobs miss that once in a hundred runs.
    for _ in 0..16 {
        let out = launch::hccnrun(32, &probe(), &["--barrier-only"], &env, Duration::from_secs(30));
        check_clean(32, &out);
    }
}

#[test]
fn a_job_of_32_local_ranks_over_shared_memory_is_clean_and_a_rank_uses_no_more_memory_than_among_4() {
    // Every pair has its segment (2 MiB), but pages are taken only where rings are used: the
    // barrier and the small allreduce touch a few slots of a few rings.
    let small = clean_job_over("shm", 4, &[], Duration::from_secs(20));
    let large = clean_job_over("shm", 32, &[], Duration::from_secs(40));
    assert!(large.threads <= MAX_THREADS, "rank 0 of 32 holds {} threads", large.threads);
    assert!(
        large.rss_mb <= small.rss_mb + 8,
        "peak memory grew with local peers: 4 ranks {small:?}, 32 ranks {large:?}"
    );
}

/// Connections each rank holds after a ring allreduce (and the barrier before it), as
/// `hccn-info --resources` counts them on every rank of `n` over TCP.
fn connections_after_a_ring_allreduce(n: u32, env: &[(&str, &str)]) -> Vec<usize> {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let info = launch::bin("hccn-info");
    let mut all_env = vec![("HCCN_TRANSPORT", "tcp"), ("HCCN_ALGO", "ring")];
    all_env.extend_from_slice(env);
    let out = launch::hccnrun(n, &info, &["--resources"], &all_env, Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    // Rank 0 prints a row per rank: rank, connections, threads, ...
    let rows: Vec<usize> = (0..n)
        .map(|r| {
            let row =
                out.stdout.lines().find_map(|l| l.strip_prefix("[0] ").filter(|l| l.starts_with(&format!("{r} "))));
            let cell = row.and_then(|l| l.split_whitespace().nth(1)).and_then(|c| c.parse::<f64>().ok());
            cell.unwrap_or_else(|| panic!("no row for rank {r}: {}", out.describe())) as usize
        })
        .collect();
    eprintln!("{n} ranks: connections per rank {:?}..{:?}", rows.iter().min(), rows.iter().max());
    rows
}

#[test]
fn a_ring_allreduce_among_64_ranks_opens_a_few_connections_per_rank_not_63() {
    // The world forms with 3 neighbours on each side and the 6 hypercube partners; the barrier's
    // dissemination and the ring add at most one per round; nothing grows like n.
    let bound = |n: u32| 2 * 3 + 2 * n.ilog2() as usize + 2;
    let on_demand = connections_after_a_ring_allreduce(64, &[]);
    assert!(on_demand.iter().all(|&c| c <= bound(64)), "64 ranks: {on_demand:?}");
    let larger = connections_after_a_ring_allreduce(128, &[]);
    assert!(larger.iter().all(|&c| c <= bound(128)), "128 ranks: {larger:?}");
    // The same job connecting every pair as it forms, for contrast.
    let full = connections_after_a_ring_allreduce(64, &[("HCCN_FULL_MESH_UP_TO", "64")]);
    assert!(full.iter().all(|&c| c == 63), "a full mesh of 64: {full:?}");
}

/// The first field after `[r] WORD ` in `out`: a wall-clock millisecond.
fn at(out: &Outcome, r: u32, word: &str) -> u128 {
    let prefix = format!("[{r}] {word} ");
    let line = out.stdout.lines().find_map(|l| l.strip_prefix(&prefix));
    let ms = line.and_then(|l| l.split_whitespace().next()).and_then(|v| v.parse().ok());
    ms.unwrap_or_else(|| panic!("no {prefix:?}: {}", out.describe()))
}

/// A fault program (tests/src/bin/hccn-faults.rs) on `n` ranks over TCP, whose last rank is the
/// victim: every survivor reports RANK_FAILED naming it and no other rank, within `within_ms` of
/// the fault; returns the outcome.
fn survivors_blame_the_victim(n: u32, mode: &str, fault_word: &str, within_ms: u128) -> Outcome {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let faults = PathBuf::from(env!("CARGO_BIN_EXE_hccn-faults"));
    let out = launch::hccnrun(n, &faults, &[mode], &[("HCCN_TRANSPORT", "tcp")], Duration::from_secs(60));
    let victim = n - 1;
    let fault_at = at(&out, victim, fault_word);
    for r in 0..victim {
        let line = out.stdout.lines().find(|l| l.starts_with(&format!("[{r}] ERROR_AT"))).unwrap_or_default();
        assert!(line.contains("code=100") && line.contains(&format!("failed=[{victim}]")), "rank {r}: {line}");
        let after = at(&out, r, "ERROR_AT").saturating_sub(fault_at);
        assert!(after <= within_ms, "rank {r} of {n} heard of the {mode} after {after} ms: {}", out.describe());
    }
    out
}

#[test]
fn kill_9_of_one_rank_among_128_is_reported_by_every_survivor_naming_only_it() {
    // A crash shows on every link at once (EOF); survivors that leave right after their error
    // must not be blamed by those still sending to them.
    survivors_blame_the_victim(128, "kill-small", "KILL_AT", 2000);
}

#[test]
fn a_dial_to_a_frozen_rank_ends_once_it_is_known_lost_not_at_the_dial_timeout() {
    // 6 ranks connecting on demand, one neighbour watched each side: rank 2 has no link to
    // rank 5 (not a neighbour, 2 xor 5 is no power of two), and dials it after it froze.
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let faults = PathBuf::from(env!("CARGO_BIN_EXE_hccn-faults"));
    let env = [("HCCN_TRANSPORT", "tcp"), ("HCCN_FULL_MESH_UP_TO", "0"), ("HCCN_WATCHED_PEERS", "1")];
    let out = launch::hccnrun(6, &faults, &["freeze-dial", "2"], &env, Duration::from_secs(60));
    let line = out.stdout.lines().find(|l| l.starts_with("[2] ERROR_AT")).unwrap_or_default();
    assert!(line.contains("code=100") && line.contains("failed=[5]"), "rank 2: {line}: {}", out.describe());
    let after = at(&out, 2, "ERROR_AT").saturating_sub(at(&out, 5, "FREEZE_AT"));
    // Known lost within about HCCN_DEAD_AFTER_MS; the dial's own timeout is 10 s.
    assert!(after < 6000, "the dial to the frozen rank ended {after} ms after the freeze: {}", out.describe());
}

#[test]
fn a_frozen_rank_among_64_is_found_by_its_watchers_and_told_to_every_rank() {
    // Only 6 of the 63 survivors watch the frozen rank (HCCN_WATCHED_PEERS=3): the others learn
    // from their notice. Silence counts from up to a heartbeat before the freeze.
    let out = survivors_blame_the_victim(64, "freeze", "FREEZE_AT", 2500);
    for r in 0..63 {
        assert!(out.stdout.contains(&format!("[{r}] SHRUNK size=63 epoch=1 result=Ok(())")), "{}", out.describe());
    }
}
