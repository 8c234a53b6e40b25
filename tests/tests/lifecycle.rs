//! Misuse across a process's life, with real processes: a forked child and its parent's
//! communicator (tests/src/bin/hccn-fork.rs), a full /dev/shm, group lists that differ, a store
//! address that is no hccn store, a rank out of descriptors (hccn-shortage.rs).

use std::path::PathBuf;
use std::time::Duration;

use hccn_tests::launch;

/// Lines of `out` that report a check, each of which must pass.
fn checked_lines(out: &launch::Outcome, what: &str, at_least: usize) {
    let lines: Vec<&str> = out.stdout.lines().filter(|l| l.contains(" CHILD ") || l.contains(" PARENT ")).collect();
    assert!(lines.len() >= at_least, "{what}: too few checks ran: {}", out.describe());
    for l in &lines {
        assert!(l.ends_with(" PASS"), "{what}: {l}\n{}", out.describe());
    }
    assert_eq!(out.code, Some(0), "{what}: {}", out.describe());
}

#[test]
fn a_forked_child_is_refused_its_parents_communicator_and_the_parent_goes_on() {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_hccn-fork"));
    for (n, env) in [(2, vec![]), (3, vec![("HCCN_TRANSPORT", "tcp")])] {
        let mut env = env;
        env.push(("HCCN_TIMEOUT_MS", "10000"));
        let out = launch::hccnrun(n, &bin, &[], &env, Duration::from_secs(90));
        checked_lines(&out, &format!("{n} ranks {env:?}"), 7 * n as usize);
    }
}

#[test]
fn sixteen_ranks_under_a_64_mib_dev_shm_fall_back_to_tcp_instead_of_dying_of_sigbus() {
    // Docker's default /dev/shm, in a private mount namespace: 16 ranks' pair segments (2 MiB
    // each) do not fit. Every pair's rings are filled by a 16 MiB alltoall (single-copy reads
    // off, so that the bytes go through the rings).
    let perf = launch::bin("hccn-perf");
    let run = format!(
        "mount -t tmpfs -o size=64m tmpfs /dev/shm || exit 97; exec {} -n 16 {} --op alltoall -b 16M -e 16M -w 1 -n 2 -c",
        launch::bin("hccnrun").display(),
        perf.display()
    );
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", &run]).env("HCCN_CMA", "off");
    let out = launch::run(cmd, Duration::from_secs(240));
    assert_ne!(out.code, Some(97), "needs root to mount a small /dev/shm: {}", out.describe());
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(out.stdout.contains("Wrong elements       : 0 OK"), "{}", out.describe());
    // One warning per rank at most, naming /dev/shm and what to do (a loaded host may add
    // others, about late ranks: not this test's concern).
    let warnings: Vec<&str> = out
        .stderr
        .lines()
        .chain(out.stdout.lines())
        .filter(|l| l.contains(" WARN ") && l.contains("shared memory"))
        .collect();
    assert!(!warnings.is_empty() && warnings.len() <= 16, "{warnings:#?}");
    assert!(warnings.iter().all(|w| w.contains("/dev/shm is full") && w.contains("64 MiB")), "{warnings:#?}");
}

#[test]
fn group_lists_that_differ_across_ranks_fail_at_creation_naming_the_ranks() {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_hccn-groups"));
    let env = [("HCCN_TIMEOUT_MS", "3000")];
    for n in [2, 3, 4] {
        let out = launch::hccnrun(n, &bin, &["order"], &env, Duration::from_secs(60));
        let cases: Vec<&str> = out.stdout.lines().filter(|l| l.contains(" CASE ")).collect();
        assert_eq!(cases.len(), n as usize, "{}", out.describe());
        for c in &cases {
            // At once, on every rank, not at the deadline.
            assert!(c.contains("code=107") && c.contains("another order"), "{n} ranks: {c}");
            let ms: u64 = c.split(" ms=").nth(1).and_then(|s| s.split(' ').next()?.parse().ok()).unwrap_or(u64::MAX);
            assert!(ms < 2500, "{n} ranks: {c}");
        }
        assert_eq!(out.code, Some(0), "the job goes on after the mismatch: {}", out.describe());
    }
    // Member sets that differ: the members tell each other their lists while they wait, and
    // every rank fails at creation with MISMATCH naming both lists, not at the deadline.
    for n in [3, 4] {
        let out = launch::hccnrun(n, &bin, &["members"], &env, Duration::from_secs(60));
        let cases: Vec<&str> = out.stdout.lines().filter(|l| l.contains(" CASE ")).collect();
        assert_eq!(cases.len(), n as usize, "{}", out.describe());
        let (short, full): (Vec<u32>, Vec<u32>) = ((0..n - 1).collect(), (0..n).collect());
        for c in &cases {
            assert!(c.contains("code=107") && c.contains("lists differ"), "{n} ranks: {c}");
            assert!(c.contains(&format!("{short:?}")) && c.contains(&format!("{full:?}")), "{n} ranks: {c}");
            let ms: u64 = c.split(" ms=").nth(1).and_then(|s| s.split(' ').next()?.parse().ok()).unwrap_or(u64::MAX);
            assert!(ms < 2500, "{n} ranks: {c}");
        }
        assert_eq!(out.code, Some(0), "{}", out.describe());
    }
    // A rank that lists ranks which leave it out: theirs is a group of their own; it waits
    // alone and fails at the deadline, told that the lists may differ.
    let out = launch::hccnrun(3, &bin, &["extra"], &env, Duration::from_secs(60));
    let cases: Vec<&str> = out.stdout.lines().filter(|l| l.contains(" CASE ")).collect();
    assert_eq!(cases.len(), 3, "{}", out.describe());
    let failed: Vec<&&str> = cases.iter().filter(|c| !c.contains("code=0 ")).collect();
    assert_eq!(failed.len(), 1, "{cases:#?}");
    assert!(failed[0].contains("code=9") && failed[0].contains("same list"), "{cases:#?}");
}

/// Serves every connection to a loopback port with `answer` (given what the client sent first)
/// until the test ends; returns the port.
fn foreign_server(answer: fn(&[u8]) -> Vec<u8>) -> u16 {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut got = vec![0u8; 256];
                let n = c.read(&mut got).unwrap_or(0);
                let _ = c.write_all(&answer(&got[..n]));
                std::thread::sleep(Duration::from_secs(60));
            });
        }
    });
    port
}

#[test]
fn a_store_address_that_is_no_hccn_store_is_named_as_such_within_seconds() {
    let echo = foreign_server(|got| got.to_vec());
    let banner = foreign_server(|_| b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n".to_vec());
    let http = foreign_server(|_| b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n".to_vec());
    for (what, port, needle) in [
        ("echo", echo, "not an hccn store"),
        ("banner", banner, "not an hccn store"),
        ("http", http, "not an hccn store"),
        ("port 0", 0, "port 0"),
    ] {
        let mut cmd = std::process::Command::new(launch::bin("hccn-perf"));
        cmd.args(["-b", "4", "-e", "4"])
            .env("HCCN_RANK", "0")
            .env("HCCN_WORLD_SIZE", "2")
            .env("HCCN_STORE", format!("tcp://127.0.0.1:{port}"))
            .env("HCCN_JOB_TOKEN", "t")
            .env("HCCN_TIMEOUT_MS", "30000");
        let out = launch::run(cmd, Duration::from_secs(60));
        assert_ne!(out.code, Some(0), "{what}: {}", out.describe());
        assert!(out.elapsed < Duration::from_secs(3), "{what}: took {:?}: {}", out.elapsed, out.describe());
        let text = format!("{}{}", out.stdout, out.stderr);
        assert!(text.contains(needle) && text.contains("tcp://127.0.0.1:"), "{what}: {}", out.describe());
    }
}

#[test]
fn a_rank_out_of_descriptors_fails_as_itself_and_blames_no_healthy_peer() {
    // Every link beyond each rank's two neighbours and hypercube partners opens on its first
    // message; rank 1 runs out of descriptors before its alltoall opens one.
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_hccn-shortage"));
    let env = [("HCCN_FULL_MESH_UP_TO", "0"), ("HCCN_WATCHED_PEERS", "1"), ("HCCN_TIMEOUT_MS", "10000")];
    let out = launch::hccnrun(8, &bin, &[], &env, Duration::from_secs(90));
    let what = out.describe();
    let short = out.stdout.lines().find(|l| l.starts_with("[1] FIRST")).unwrap_or_else(|| panic!("{what}"));
    assert!(short.contains("out of file descriptors") && short.contains("not its peer's failure"), "{short}\n{what}");
    assert!(!short.contains("code=100 "), "the shortage was reported as a failed peer: {short}\n{what}");
    assert_eq!(out.stdout.matches("END failed=[]").count(), 8, "a healthy rank was held failed: {what}");
    assert_eq!(out.stdout.matches("SECOND ok").count(), 8, "{what}");
    assert_eq!(out.code, Some(0), "{what}");
}

#[test]
fn ranks_started_with_different_world_sizes_are_told_both_sizes_at_once() {
    // hccnrun starts 3 ranks; a wrapper tells one of them the world has 2 (rank 1: among those
    // rank 0 gathers; rank 0 itself: the others are outside its world). The ranks ignore
    // SIGTERM: when the first fails, hccnrun's stop leaves the others the second before
    // SIGKILL to say why (they were sometimes stopped before they printed it).
    let info = launch::bin("hccn-info");
    for odd in ["1", "0"] {
        let script = format!(
            "if [ \"$HCCN_RANK\" = {odd} ]; then export HCCN_WORLD_SIZE=2; fi; trap '' TERM; exec {} --resources",
            info.display()
        );
        let mut cmd = std::process::Command::new(launch::bin("hccnrun"));
        cmd.args(["-n", "3", "sh", "-c", &script]).env("HCCN_TIMEOUT_MS", "20000");
        let t = std::time::Instant::now();
        let out = launch::run(cmd, Duration::from_secs(60));
        let secs = t.elapsed().as_secs_f64();
        let what = format!("rank {odd} told 2: {}", out.describe());
        assert_ne!(out.code, Some(0), "{what}");
        let told = out.stderr.lines().filter(|l| l.contains("world sizes differ")).count()
            + out.stdout.lines().filter(|l| l.contains("world sizes differ")).count();
        let all = format!("{}{}", out.stdout, out.stderr);
        let both = |a: &str, b: &str| all.contains(&format!("a world of {a} ranks, rank 1 with {b}"));
        assert!(told >= 2 && (both("3", "2") || both("2", "3")), "{what}");
        // Well before the 20 s deadline that used to be the only answer.
        assert!(secs < 10.0, "took {secs:.1} s: {what}");
    }
}

/// Lines of `out` (stdout and stderr, each prefixed `[r]` by hccnrun) that rank `rank` printed.
fn lines_of(out: &launch::Outcome, rank: u32) -> Vec<String> {
    let prefix = format!("[{rank}] ");
    out.stdout.lines().chain(out.stderr.lines()).filter(|l| l.starts_with(&prefix)).map(str::to_owned).collect()
}

#[test]
fn a_rank_of_another_hccn_protocol_is_named_by_every_rank_at_once() {
    // hccnrun starts 3 ranks; one of them publishes the record of a future protocol (99) and
    // nothing else (tests/src/bin/hccn-other-protocol.rs): rank 1 (whose record rank 0 reads),
    // then rank 0 (whose record the others read). The real ranks ignore SIGTERM, so that when
    // the first of them fails, hccnrun's stop leaves the others the second before SIGKILL to
    // say why.
    let (info, other) = (launch::bin("hccn-info"), env!("CARGO_BIN_EXE_hccn-other-protocol"));
    let ours = format!("runs protocol {} (hccn {})", hccn_runtime::wire::VERSION, env!("CARGO_PKG_VERSION"));
    for odd in [1u32, 0] {
        let script = format!(
            "if [ \"$HCCN_RANK\" = {odd} ]; then exec {other} 'hccn/99 9.9.9 a layout of protocol 99'; fi; \
             trap '' TERM; exec {} --resources",
            info.display()
        );
        let mut cmd = std::process::Command::new(launch::bin("hccnrun"));
        cmd.args(["-n", "3", "sh", "-c", &script]).env("HCCN_TIMEOUT_MS", "20000");
        let out = launch::run(cmd, Duration::from_secs(60));
        let what = format!("rank {odd} of protocol 99: {}", out.describe());
        assert_ne!(out.code, Some(0), "{what}");
        for rank in (0..3).filter(|&r| r != odd) {
            let told = lines_of(&out, rank).into_iter().find(|l| l.contains("hccn versions differ"));
            let told = told.unwrap_or_else(|| panic!("rank {rank} did not say: {what}"));
            assert!(told.contains(&format!("rank {odd} runs protocol 99 (hccn 9.9.9)")), "{told}\n{what}");
            // Rank 0's words where rank 0 found it first.
            assert!(told.contains(&ours), "{told}\n{what}");
        }
        // Well before the 20 s deadline that used to be the only answer.
        assert!(out.elapsed < Duration::from_secs(10), "{what}");
    }
}

#[test]
fn a_rank_that_waits_alone_under_another_job_id_names_the_job_id() {
    // hccnrun gives every rank its job's id; a wrapper gives rank 1 another, so the two ranks
    // wait in different places in the store and never meet. The rank that gives up first (a
    // 2 s deadline, the other's is 60 s) names the job id it waited under.
    let info = launch::bin("hccn-info");
    for (short, job) in [(1u32, "\"elsewhere\""), (0, "\"job-")] {
        let script = format!(
            "if [ \"$HCCN_RANK\" = 1 ]; then export HCCN_JOB_ID=elsewhere; fi; \
             if [ \"$HCCN_RANK\" = {short} ]; then export HCCN_TIMEOUT_MS=2000; fi; exec {} --resources",
            info.display()
        );
        let mut cmd = std::process::Command::new(launch::bin("hccnrun"));
        cmd.args(["-n", "2", "sh", "-c", &script]).env("HCCN_TIMEOUT_MS", "60000");
        let out = launch::run(cmd, Duration::from_secs(60));
        let what = format!("rank {short} gave up first: {}", out.describe());
        assert_ne!(out.code, Some(0), "{what}");
        let told = lines_of(&out, short).into_iter().find(|l| l.contains("did not meet"));
        let told = told.unwrap_or_else(|| panic!("rank {short} did not say: {what}"));
        assert!(told.contains(&format!("waited under job id {job}")), "{told}\n{what}");
        assert!(told.contains("ranks started with another job id") && told.contains("HCCN_JOB_ID"), "{told}\n{what}");
        assert!(out.elapsed < Duration::from_secs(30), "{what}");
    }
}
