//! No split brain: a rank frozen while the others go on, or a coordinator frozen during a
//! shrink, wakes up to find itself left out (HCCN_ERROR_STALE_EPOCH), never with a working
//! communicator of its own; on the embedded store and on etcd. Real processes, SIGSTOP/SIGCONT
//! from the test (tests/src/bin/hccn-netfault.rs trains and shrinks on errors).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use hccn_tests::launch::{self, Outcome, Progress};

fn workload() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_hccn-netfault"))
}

/// The pid of rank `r` from its START line, once it has printed one.
fn pid(p: &Progress, r: u32) -> i32 {
    let line = p.wait_line(Duration::from_secs(60), |l| l.starts_with(&format!("[{r}] START "))).unwrap_or_default();
    let pid = line.split("pid=").nth(1).and_then(|v| v.split_whitespace().next()?.parse().ok());
    pid.unwrap_or_else(|| panic!("no START line of rank {r}"))
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: a signal to a rank of the job this test started.
    unsafe { libc::kill(pid, sig) };
}

/// Runs 4 ranks of the workload under hccnrun (`extra` before `--`), calling `fault` once every
/// rank has started.
fn job(extra: &[&str], fault: impl FnOnce(&Progress)) -> Outcome {
    let mut cmd = Command::new(launch::bin("hccnrun"));
    cmd.args(["-n", "4", "--grace", "60"]).args(extra).arg("--").arg(workload()).arg("6");
    cmd.env("HCCN_TIMEOUT_MS", "8000");
    launch::run_watching(cmd, Duration::from_secs(120), fault)
}

/// Ranks `kept` end as one group of their number (same epoch), with exact results; each of
/// `out_ranks` is left out with STALE_EPOCH and never finishes. Lines are found by what they say:
/// hccnrun labels them with the ranks as they are when it forwards them (with the embedded store,
/// the left-out rank's as `[left]`).
fn expect(out: &Outcome, kept: &[u32], out_ranks: &[u32]) {
    let done: Vec<&str> = out.stdout.lines().filter(|l| l.contains("] DONE ")).collect();
    assert_eq!(done.len(), kept.len(), "the survivors finish, and only they: {}", out.describe());
    let mut epochs = Vec::new();
    for line in done {
        assert!(line.contains(&format!("size={} ", kept.len())), "{line}\n{}", out.describe());
        assert!(line.contains(" wrong=0 "), "{line}");
        epochs.push(line.split("epoch=").nth(1).and_then(|e| e.split(' ').next()).unwrap_or("").to_owned());
    }
    assert!(
        epochs.windows(2).all(|w| w[0] == w[1]),
        "the survivors disagree on the epoch: {epochs:?}\n{}",
        out.describe()
    );
    let left: Vec<&str> = out.stdout.lines().filter(|l| l.contains("] OUT ")).collect();
    assert_eq!(left.len(), out_ranks.len(), "ranks {out_ranks:?} are left out: {}", out.describe());
    for line in left {
        assert!(line.contains("code=106"), "{line}");
    }
}

fn frozen_member_wakes_up_left_out(extra: &[&str]) -> Outcome {
    let out = job(extra, |p| {
        let victim = pid(p, 2);
        (0..4).for_each(|r| {
            pid(p, r);
        });
        std::thread::sleep(Duration::from_millis(800));
        signal(victim, libc::SIGSTOP);
        std::thread::sleep(Duration::from_secs(3));
        signal(victim, libc::SIGCONT);
    });
    expect(&out, &[0, 1, 3], &[2]);
    out
}

#[test]
fn a_frozen_member_wakes_up_left_out_on_the_embedded_store() {
    let out = frozen_member_wakes_up_left_out(&[]);
    // The job did not end well, whatever the left-out rank's exit code: hccnrun says so.
    assert_ne!(out.code, Some(0), "{}", out.describe());
    assert!(out.stderr.contains("rank 2 was left out of its world"), "{}", out.describe());
    assert!(out.stdout.lines().any(|l| l.starts_with("[left] OUT ")), "labelled as left out: {}", out.describe());
}

#[test]
fn a_frozen_member_wakes_up_left_out_on_etcd() {
    frozen_member_wakes_up_left_out(&["--etcd-local"]);
}

fn frozen_coordinator_wakes_up_left_out(extra: &[&str]) {
    let out = job(extra, |p| {
        let (coordinator, victim) = (pid(p, 0), pid(p, 3));
        (1..3).for_each(|r| {
            pid(p, r);
        });
        std::thread::sleep(Duration::from_millis(800));
        // Rank 3 dies; rank 0, the shrink's coordinator, freezes as the shrink begins.
        signal(victim, libc::SIGKILL);
        std::thread::sleep(Duration::from_millis(2));
        signal(coordinator, libc::SIGSTOP);
        std::thread::sleep(Duration::from_secs(3));
        signal(coordinator, libc::SIGCONT);
    });
    expect(&out, &[1, 2], &[0]);
}

#[test]
fn a_coordinator_frozen_during_a_shrink_wakes_up_left_out_on_the_embedded_store() {
    frozen_coordinator_wakes_up_left_out(&[]);
}

#[test]
fn a_coordinator_frozen_during_a_shrink_wakes_up_left_out_on_etcd() {
    frozen_coordinator_wakes_up_left_out(&["--etcd-local"]);
}
