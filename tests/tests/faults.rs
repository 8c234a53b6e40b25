//! Dead peers, deadlines and intruders, with real processes.

use std::path::PathBuf;
use std::time::Duration;

use hccn_tests::launch;

fn faults() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_hccn-faults"))
}

/// The number after `word ` on the line starting with `[rank] word`.
fn field(out: &str, rank: u32, word: &str) -> Option<u128> {
    let prefix = format!("[{rank}] {word} ");
    out.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

fn pid_alive(pid: u128) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

#[test]
fn sigkill_mid_allreduce_fails_survivors_within_two_seconds() {
    for n in [3u32, 4] {
        sigkill_mid_allreduce(n, &[]);
    }
}

#[test]
fn sigkill_mid_a_single_copy_ring_allreduce_fails_survivors_within_two_seconds() {
    // 64 MiB over the ring: every chunk goes by descriptor, read from the sender's memory
    // (HCCN_CMA=on: whatever a read costs this host).
    for n in [2u32, 4] {
        let env = [("HCCN_ALGO", "ring"), ("HCCN_CMA", "on"), ("HCCN_LOG", "hccn_runtime::transport=info")];
        let out = sigkill_mid_allreduce(n, &env);
        let all = format!("{}{}", out.stdout, out.stderr);
        assert!(all.contains("cma=true"), "no single-copy link: {}", out.describe());
    }
}

#[test]
fn sigkill_amid_small_board_allreduces_fails_survivors_within_two_seconds() {
    // 64-byte allreduces on one host: the survivors wait on the shared-memory board, not on a
    // socket or ring, when the victim dies.
    for n in [2u32, 4] {
        sigkill_mid(n, "kill-small", &[]);
    }
}

#[test]
fn sigkill_amid_small_collectives_of_every_kind_fails_survivors_within_two_seconds() {
    // Broadcast, reduce, allgather, reduce-scatter, alltoall, gather, scatter and barrier take
    // the board too.
    for n in [2u32, 3, 4] {
        sigkill_mid(n, "kill-small-every-kind", &[]);
    }
}

#[test]
fn sigkill_amid_mid_sized_collectives_of_every_kind_fails_survivors_within_two_seconds() {
    // Blocks of 16 KiB: past the board, below single copy; two ranks' rooted calls (broadcast,
    // reduce, gather, scatter) cross their verification frame with the data (verify.rs).
    for n in [2u32, 3] {
        sigkill_mid(n, "kill-mid-every-kind", &[]);
    }
}

#[test]
fn sigkill_amid_large_collectives_of_every_kind_fails_survivors_within_two_seconds() {
    // Blocks of 256 KiB: alltoall's and scatter's go by descriptor (read in place; HCCN_CMA=on,
    // whatever a read costs this host) even where the ranks share cores, the rings' chunks
    // through the rings; a reader of a dead sender's memory, and a sender waiting for a dead
    // reader, must fail.
    for n in [3u32, 4] {
        sigkill_mid(n, "kill-large-every-kind", &[("HCCN_CMA", "on")]);
    }
    // Blocks of 8 MiB: a step starts more sends than `Sends` holds and waits for the oldest
    // amid the step, on a reader that may be dead.
    sigkill_mid(2, "kill-huge-every-kind", &[("HCCN_CMA", "on")]);
}

/// The last of `n` ranks SIGKILLs itself in a large allreduce: every survivor must report the
/// failure (naming it) within 2 s, and no process may outlive the job.
fn sigkill_mid_allreduce(n: u32, env: &[(&str, &str)]) -> launch::Outcome {
    sigkill_mid(n, "kill", env)
}

fn sigkill_mid(n: u32, mode: &str, env: &[(&str, &str)]) -> launch::Outcome {
    let out = launch::hccnrun(n, &faults(), &[mode], env, Duration::from_secs(120));
    let victim = n - 1;
    // hccnrun reports the victim's death by signal and returns 128 + 9.
    assert_eq!(out.code, Some(137), "{}", out.describe());
    let killed_at = field(&out.stdout, victim, "KILL_AT").unwrap_or_else(|| panic!("no KILL_AT: {}", out.describe()));
    for r in 0..victim {
        let line = out
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("[{r}] ERROR_AT")))
            .unwrap_or_else(|| panic!("rank {r} saw no error: {}", out.describe()));
        assert!(line.contains("code=100"), "rank {r}: {line}");
        assert!(line.contains(&format!("failed=[{victim}]")), "rank {r}: {line}");
        let at = field(&out.stdout, r, "ERROR_AT").unwrap_or(0);
        assert!(
            at >= killed_at && at - killed_at <= 2000,
            "rank {r} noticed after {} ms: {}",
            at.saturating_sub(killed_at),
            out.describe()
        );
        assert!(out.stdout.contains(&format!("[{r}] AFTER code=Some(100) async=100")), "{}", out.describe());
    }
    for r in 0..n {
        if let Some(pid) = field(&out.stdout, r, "PID") {
            assert!(!pid_alive(pid), "rank {r} (pid {pid}) outlived the job");
        }
    }
    out
}

#[test]
fn wrong_token_is_refused_while_the_job_keeps_working() {
    let out = launch::hccnrun(3, &faults(), &["intruder"], &[], Duration::from_secs(120));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(out.stdout.contains("INTRUDER refused code=104"), "{}", out.describe());
    for r in 0..3 {
        assert!(out.stdout.contains(&format!("[{r}] JOB_OK wrong=0")), "{}", out.describe());
    }
}

#[test]
fn a_rank_that_never_joins_is_a_timeout_not_a_hang() {
    let out = launch::hccnrun(2, &faults(), &["deadline"], &[("HCCN_TIMEOUT_MS", "700")], Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let ms = out
        .stdout
        .lines()
        .find(|l| l.starts_with("[0] DEADLINE code=Some(9)"))
        .and_then(|l| l.split("in_ms=").nth(1))
        .and_then(|v| v.trim().parse::<u64>().ok());
    let ms = ms.unwrap_or_else(|| panic!("no DEADLINE line: {}", out.describe()));
    assert!((600..2500).contains(&ms), "timeout after {ms} ms with HCCN_TIMEOUT_MS=700");
}

/// hccnrun starts 4 ranks of `hccn-info --resources` (init, meet, finish) over TCP with a
/// 2 s timeout; a wrapper holds rank r back r seconds, so the last starts after the first's
/// timeout. `never`: a rank that sleeps instead and never comes.
fn staggered_info(never: Option<u32>) -> launch::Outcome {
    let info = launch::bin("hccn-info");
    let hold = never.map(|r| format!("if [ \"$HCCN_RANK\" = {r} ]; then exec sleep 30; fi; ")).unwrap_or_default();
    let script = format!("{hold}sleep \"$HCCN_RANK\"; exec {} --resources", info.display());
    let mut cmd = std::process::Command::new(launch::bin("hccnrun"));
    cmd.args(["-n", "4", "sh", "-c", &script]).env("HCCN_TIMEOUT_MS", "2000").env("HCCN_TRANSPORT", "tcp");
    launch::run(cmd, Duration::from_secs(60))
}

#[test]
fn ranks_that_keep_arriving_meet_although_starting_them_takes_longer_than_the_timeout() {
    let out = staggered_info(None);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(out.elapsed >= Duration::from_secs(3), "the last rank starts 3 s in: {}", out.describe());
}

#[test]
fn a_rank_that_never_comes_fails_the_others_a_timeout_after_the_last_arrival() {
    let out = staggered_info(Some(3));
    assert_ne!(out.code, Some(0), "{}", out.describe());
    let all = format!("{}{}", out.stdout, out.stderr);
    let named = all.lines().filter(|l| l.contains("ranks [3] never published their address")).count();
    assert!(named >= 3, "ranks 0, 1 and 2 name rank 3: {}", out.describe());
    // Rank 2 arrives about 2 s in; the others give up about 2 s later, not at 2 s (their own
    // timeout) nor at 30 s (the sleeper's end).
    let secs = out.elapsed.as_secs_f64();
    assert!((3.8..15.0).contains(&secs), "the job ended after {secs:.1} s: {}", out.describe());
}

/// Words of the runtime's insides that a person reading an error has no use for.
const INSIDE_WORDS: [&str; 3] = ["board", "slot", "turn"];

#[test]
fn a_rank_late_into_a_small_allreduce_is_named_plainly_by_every_waiting_rank() {
    // Past the deadline: every waiting rank's error names rank 2, in words for people.
    let out = launch::hccnrun(4, &faults(), &["late", "3000"], &[("HCCN_TIMEOUT_MS", "1500")], Duration::from_secs(60));
    let late: Vec<&str> = out.stdout.lines().filter(|l| l.contains(" LATE ")).collect();
    assert_eq!(late.len(), 3, "{}", out.describe());
    for l in &late {
        assert!(l.contains("code=9 ") && l.contains("rank 2 has not joined this call"), "{l}\n{}", out.describe());
        let lower = l.to_lowercase();
        assert!(!INSIDE_WORDS.iter().any(|w| lower.contains(w)), "runtime words in: {l}");
    }
    // Before the deadline: one warning per waiting rank names rank 2 at half of it, and the call
    // succeeds once rank 2 comes.
    let out = launch::hccnrun(4, &faults(), &["late", "5000"], &[("HCCN_TIMEOUT_MS", "8000")], Duration::from_secs(60));
    assert_eq!(out.stdout.matches(" LATE code=0 ").count(), 3, "{}", out.describe());
    let warnings: Vec<&str> = out.stderr.lines().filter(|l| l.contains("has waited")).collect();
    assert_eq!(warnings.len(), 3, "{}", out.describe());
    for w in &warnings {
        assert!(w.contains("rank 2 has not joined this call"), "{w}");
        let lower = w.to_lowercase();
        assert!(!INSIDE_WORDS.iter().any(|x| lower.contains(x)), "runtime words in: {w}");
    }
}

/// The survivors' lines of a `leave` run: (code, failed ranks, milliseconds of the call).
fn left_lines(out: &launch::Outcome, n: u32) -> Vec<(u128, String, u128)> {
    (0..n - 1)
        .map(|r| {
            let line = out.stdout.lines().find(|l| l.starts_with(&format!("[{r}] LEFT "))).unwrap_or_else(|| {
                panic!("rank {r} printed no LEFT line: {}", out.describe());
            });
            let kv = |key: &str| line.split(&format!(" {key}=")).nth(1).and_then(|v| v.split(' ').next());
            let code = kv("code").and_then(|v| v.parse().ok()).unwrap_or(0);
            let ms = kv("in_ms").and_then(|v| v.parse().ok()).unwrap_or(u128::MAX);
            (code, kv("failed").unwrap_or("").to_owned(), ms)
        })
        .collect()
}

#[test]
fn a_rank_that_exits_without_destroy_is_a_failure_named_at_once() {
    let out = launch::hccnrun(3, &faults(), &["leave", "exit"], &[], Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    for (code, failed, ms) in left_lines(&out, 3) {
        assert_eq!(code, 100, "RANK_FAILED: {}", out.describe());
        assert_eq!(failed, "[2]", "the rank that exited is named: {}", out.describe());
        assert!(ms < 100, "{ms} ms to report it: {}", out.describe());
    }
    assert_eq!(out.stdout.matches("SHRUNK size=2 epoch=1").count(), 2, "{}", out.describe());
}

#[test]
fn a_rank_that_destroyed_and_left_is_named_at_once_without_a_grace_wait() {
    let out = launch::hccnrun(4, &faults(), &["leave", "destroy"], &[], Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    for (code, failed, ms) in left_lines(&out, 4) {
        assert_eq!(code, 21, "HCCN_ERROR_REMOTE: {}", out.describe());
        assert_eq!(failed, "[3]", "the rank that left is named: {}", out.describe());
        assert!(ms < 100, "{ms} ms to report it: {}", out.describe());
    }
    assert_eq!(out.stdout.matches("SHRUNK size=3 epoch=1").count(), 3, "{}", out.describe());
}
