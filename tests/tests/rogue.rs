//! Rogue peers against a live 4-rank job (tests/src/bin/hccn-rogue.rs): connections to a rank's
//! listening port and to the store's port with no token, a wrong token, random bytes, a frame
//! header with an absurd length, a slow sender that never finishes, a token holder that is not a
//! member (or asks the store for an absurd value) and a replay of a captured handshake. Each is
//! refused and logged, the job's allreduces stay exact, and neither the ranks nor hccnrun (which
//! hosts the store) grow in descriptors or memory.

use std::path::PathBuf;
use std::time::Duration;

use hccn_tests::launch;

const ROUNDS: usize = 12;
/// Growth of resident memory allowed between the warm and the final sample of a process.
const RSS_MARGIN_KB: u64 = 4 << 10;

fn num(line: &str, name: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {line:?}"))
}

#[test]
fn rogue_connections_are_refused_and_logged_while_the_job_stays_exact() {
    let rogue = PathBuf::from(env!("CARGO_BIN_EXE_hccn-rogue"));
    let out = launch::hccnrun(4, &rogue, &[], &[("HCCN_LOG", "warn")], Duration::from_secs(180));
    let all = out.describe();
    assert_eq!(out.code, Some(0), "{all}");
    assert!(!out.stdout.contains("refused=false"), "an attack was not refused: {all}");

    // The rank's port: every attack of phase 1 refused by rank 0, and each refusal logged there.
    for what in ["no-token", "wrong-token", "random-bytes", "absurd-length", "slow-sender", "not-a-member", "replay"] {
        assert!(out.stdout.contains(&format!("[3] ATTACK rank {what} refused=true")), "{what}: {all}");
    }
    let rank_refusals =
        out.stderr.lines().filter(|l| l.starts_with("[0] ") && l.contains("refused a peer connection")).count();
    // The slow sender's refusal is logged when it gives up, which may be after the job ends.
    assert!(rank_refusals >= 6, "rank 0 logged {rank_refusals} refusals: {all}");
    for why in ["not an hccn handshake", "does not hold this job's token", "not an expected member"] {
        assert!(out.stderr.contains(why), "no refusal logged for {why:?}: {all}");
    }

    // The store's port: every round's attacks refused, and logged by hccnrun.
    let store_attacks =
        out.stdout.lines().filter(|l| l.starts_with("[3] ATTACK store ") && l.ends_with("refused=true")).count();
    assert_eq!(store_attacks, ROUNDS * 7, "{all}");
    let store_refusals =
        out.stderr.lines().filter(|l| !l.starts_with('[') && l.contains("store refused a connection")).count();
    assert!(store_refusals >= ROUNDS * 5, "hccnrun logged {store_refusals} store refusals: {all}");
    let closed = out
        .stderr
        .lines()
        .filter(|l| l.contains("store closed a connection") && l.contains("exceeds the limit"))
        .count();
    assert!(closed >= ROUNDS, "absurd values not logged ({closed}): {all}");

    // The job: exact, and flat in descriptors and memory (ranks and the store's host).
    for r in 0..4 {
        assert!(
            out.stdout.contains(&format!("[{r}] JOB_OK "))
                && out.stdout.contains(&format!("[{r}] WORLD rank={r} size=4")),
            "{all}"
        );
    }
    assert!(out.stdout.lines().filter(|l| l.contains("JOB_OK")).all(|l| l.contains(" wrong=0 ")), "{all}");
    let samples: Vec<&str> = out.stdout.lines().filter(|l| l.contains(" SAMPLE ")).collect();
    assert_eq!(samples.len(), 5, "{all}");
    for line in samples {
        eprintln!("{line}");
        assert!(num(line, "end_fds") <= num(line, "warm_fds"), "descriptors grew: {line}");
        assert!(num(line, "end_rss_kb") <= num(line, "warm_rss_kb") + RSS_MARGIN_KB, "memory grew: {line}");
    }
}
