//! Liveness on one host, with real processes: the kernel's word before time. A stopped rank is
//! named at once by every survivor, in words that say it is stopped; ranks starved of CPU by
//! busy loops are slow, never failed.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use hccn_tests::launch;

/// One job at a time: a detection bound measured beside another test's busy loops means little.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn faults() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_hccn-faults"))
}

/// The number after `word ` on the line starting with `[rank] word`.
fn at(out: &launch::Outcome, rank: u32, word: &str) -> u128 {
    let prefix = format!("[{rank}] {word} ");
    let value =
        out.stdout.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|rest| rest.split_whitespace().next());
    value.and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no {prefix:?}: {}", out.describe()))
}

/// 8 ranks in 4 KiB allreduces (with `env`); the last SIGSTOPs itself. Survivors shrink, reduce
/// exactly, and kill it (hccn-faults freeze). Time alone (HCCN_DEAD_AFTER_MS, 800) took
/// 750-810 ms.
fn a_stopped_rank_is_named_by_all_seven_survivors(env: &[(&str, &str)]) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let out = launch::hccnrun(8, &faults(), &["freeze", "small"], env, Duration::from_secs(120));
    assert_eq!(out.code, Some(137), "the stopped rank is killed at the end: {}", out.describe());
    let stopped_at = at(&out, 7, "FREEZE_AT");
    for r in 0..7 {
        let line = out.stdout.lines().find(|l| l.starts_with(&format!("[{r}] ERROR_AT"))).unwrap_or_default();
        assert!(line.contains("code=100 failed=[7]"), "rank {r} must name rank 7: {line}");
        assert!(line.contains("stopped") && line.contains("frozen"), "rank {r} must say rank 7 is stopped: {line}");
        let after = at(&out, r, "ERROR_AT").saturating_sub(stopped_at);
        // The target is 100 ms (50 ms of silence, then /proc); the bound allows a loaded machine.
        assert!(after < 300, "rank {r} named the stopped rank {after} ms after it stopped: {line}");
        assert!(out.stdout.contains(&format!("[{r}] SHRUNK size=7 epoch=1 result=Ok(())")), "{}", out.describe());
    }
}

#[test]
fn a_stopped_rank_is_named_by_all_seven_survivors_within_300_ms() {
    a_stopped_rank_is_named_by_all_seven_survivors(&[]);
}

#[test]
fn over_tcp_too_a_stopped_rank_is_named_by_the_kernels_word() {
    // No shared memory between the ranks: their processes are learnt from the connection's
    // hello, so the kernel still speaks for a peer on this host.
    a_stopped_rank_is_named_by_all_seven_survivors(&[("HCCN_TRANSPORT", "tcp")]);
}

/// Busy loops that die with the test, however it ends.
struct BusyLoops(Vec<Child>);

impl BusyLoops {
    fn start(n: usize) -> BusyLoops {
        let spawn = || Command::new("sh").args(["-c", "while :; do :; done"]).stdin(Stdio::null()).spawn();
        BusyLoops((0..n).map(|_| spawn().expect("spawn a busy loop")).collect())
    }
}

impl Drop for BusyLoops {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn ranks_starved_by_twelve_busy_loops_are_slow_never_failed() {
    // 8 ranks and 12 busy loops on the 2 cores: the ranks' heartbeats come late, but the kernel
    // says they are running, and no rank may be declared failed. About 5 s of exact allreduces.
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let loops = BusyLoops::start(12);
    let out = launch::hccnrun(8, &faults(), &["steady", "5"], &[], Duration::from_secs(180));
    drop(loops);
    assert_eq!(out.code, Some(0), "no rank may fail: {}", out.describe());
    for r in 0..8 {
        assert!(out.stdout.contains(&format!("[{r}] STEADY rounds=")), "rank {r}: {}", out.describe());
    }
    assert!(!out.stdout.contains("STEADY_FAILED"), "{}", out.describe());
}
