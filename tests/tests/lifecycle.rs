//! Misuse across a process's life, with real processes: a forked child and its parent's
//! communicator (tests/src/bin/hccn-fork.rs).

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
