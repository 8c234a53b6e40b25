//! Never a quiet wrong result: calls that differ across ranks, and one communicator used by two
//! threads, with real processes (tests/src/bin/hccn-integrity.rs).

use std::path::PathBuf;
use std::time::Duration;

use hccn_tests::launch;

fn integrity() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_hccn-integrity"))
}

/// Runs the mismatch matrix on `n` ranks and checks that every rank got HCCN_ERROR_MISMATCH in
/// every case, and that the job went on after each.
fn mismatch_matrix(n: u32, env: &[(&str, &str)]) {
    // Deadlines short enough that a case nobody detects fails the test well within its time.
    let mut env = env.to_vec();
    env.push(("HCCN_TIMEOUT_MS", "8000"));
    let out = launch::hccnrun(n, &integrity(), &["mismatch"], &env, Duration::from_secs(240));
    let what = format!("{n} ranks, {env:?}");
    assert_eq!(out.code, Some(0), "{what}: {}", out.describe());
    let lines: Vec<&str> = out.stdout.lines().filter(|l| l.contains(" CASE ")).collect();
    assert!(lines.len() >= 20 * n as usize, "{what}: too few cases ran: {}", out.describe());
    for line in lines {
        assert!(line.contains(" code=107 "), "{what}: every rank must get HCCN_ERROR_MISMATCH: {line}");
        assert!(line.contains("rank "), "{what}: the message names the ranks: {line}");
    }
}

#[test]
fn every_rank_of_a_mismatched_call_gets_mismatch_on_board_and_messages() {
    for n in [2, 3, 4] {
        mismatch_matrix(n, &[]);
    }
}

#[test]
fn every_rank_of_a_mismatched_call_gets_mismatch_without_the_board_and_over_tcp() {
    mismatch_matrix(2, &[("HCCN_BOARD_BYTES", "0")]);
    mismatch_matrix(4, &[("HCCN_BOARD_BYTES", "0")]);
    mismatch_matrix(3, &[("HCCN_TRANSPORT", "tcp")]);
    // Two ranks check rooted calls with one frame crossing the data (verify.rs).
    mismatch_matrix(2, &[("HCCN_TRANSPORT", "tcp")]);
}

#[test]
fn every_rank_of_a_mismatched_call_gets_mismatch_when_senders_wait_amid_a_step() {
    // 64 KiB chunks: the wide cases' steps offer more chunks than `Sends` holds, each read by
    // its receiver (HCCN_CMA=on: whatever a read costs this host).
    for n in [2, 4] {
        mismatch_matrix(n, &[("HCCN_CHUNK_BYTES", "65536"), ("HCCN_CMA", "on")]);
    }
}

/// Runs the argument-check class (tests/src/bin/hccn-refusals.rs) on `n` ranks: the ranks whose
/// check fails get their refusal, every other rank MISMATCH, and the next call pairs everywhere.
fn refusal_matrix(n: u32, env: &[(&str, &str)]) {
    let mut env = env.to_vec();
    env.push(("HCCN_TIMEOUT_MS", "8000"));
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_hccn-refusals"));
    let out = launch::hccnrun(n, &bin, &[], &env, Duration::from_secs(180));
    let what = format!("{n} ranks, {env:?}");
    let cases = out.stdout.lines().filter(|l| l.contains(" CASE ")).count();
    assert!(cases >= 120 * n as usize, "{what}: too few cases ran: {}", out.describe());
    let failed: Vec<&str> = out.stdout.lines().filter(|l| l.contains(" CASE ") && !l.ends_with(" PASS")).collect();
    assert!(failed.is_empty(), "{what}: {} cases wrong:\n{}", failed.len(), failed.join("\n"));
    assert_eq!(out.code, Some(0), "{what}: {}", out.describe());
}

#[test]
fn a_call_refused_on_some_ranks_fails_on_every_rank_and_the_next_call_pairs() {
    for n in [2, 3, 4] {
        refusal_matrix(n, &[]);
    }
    refusal_matrix(4, &[("HCCN_BOARD_BYTES", "0")]);
    refusal_matrix(3, &[("HCCN_TRANSPORT", "tcp")]);
    refusal_matrix(2, &[("HCCN_TRANSPORT", "tcp")]);
}

#[test]
fn two_threads_on_one_communicator_get_busy_never_wrong_data() {
    for n in [2, 4] {
        let out = launch::hccnrun(n, &integrity(), &["threads"], &[], Duration::from_secs(120));
        assert_eq!(out.code, Some(0), "{}", out.describe());
        for r in 0..n {
            let line = out
                .stdout
                .lines()
                .find(|l| l.starts_with(&format!("[{r}] THREADS ")))
                .unwrap_or_else(|| panic!("rank {r} printed no THREADS line: {}", out.describe()));
            assert!(line.contains(" wrong=0 "), "a call returned wrong data as success: {line}");
            assert!(line.contains(" other=0"), "only BUSY or success: {line}");
            assert!(!line.contains(" busy=0 "), "the threads overlapped, someone must have seen BUSY: {line}");
        }
    }
}

#[test]
fn point_to_point_on_another_thread_runs_beside_a_collective() {
    for n in [2, 4] {
        let out = launch::hccnrun(n, &integrity(), &["p2p-threads"], &[], Duration::from_secs(120));
        assert_eq!(out.code, Some(0), "{}", out.describe());
        for r in 0..n {
            let line = out
                .stdout
                .lines()
                .find(|l| l.starts_with(&format!("[{r}] P2P_THREADS ")))
                .unwrap_or_else(|| panic!("rank {r} printed no P2P_THREADS line: {}", out.describe()));
            assert!(line.ends_with("collectives_bad=0 messages_bad=0"), "{line}");
        }
    }
}

#[test]
fn a_send_against_a_collective_is_a_mismatch_not_a_timeout() {
    let env = [("HCCN_TIMEOUT_MS", "1500")];
    let out = launch::hccnrun(2, &integrity(), &["send-vs-collective"], &env, Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    for case in ["small", "large"] {
        let line = out
            .stdout
            .lines()
            .find(|l| l.contains(&format!("CASE {case} rank=1 ")))
            .unwrap_or_else(|| panic!("rank 1 printed no {case} case: {}", out.describe()));
        assert!(line.contains("code=107") && line.contains("a send where this rank called a collective"), "{line}");
        assert!(line.contains("rank 0 has not joined"), "{line}");
    }
}
