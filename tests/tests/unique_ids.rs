//! Unique ids leave nothing behind and are single-use (hccn-reinit, through the C ABI): a
//! process that makes thousands of communicators keeps a flat count of descriptors and threads,
//! and an id used again fails at once with a clear message, never dialling old addresses.

use std::time::Duration;

use hccn_tests::launch;

fn reinit(args: &[&str]) -> launch::Outcome {
    let mut cmd = std::process::Command::new(launch::bin("hccn-reinit"));
    cmd.args(args).env("HCCN_TIMEOUT_MS", "10000");
    launch::run(cmd, Duration::from_secs(240))
}

/// `(first, last)` of `name=A->B` in `line`.
fn before_after(line: &str, name: &str) -> (usize, usize) {
    let field = line.split_whitespace().find_map(|w| w.strip_prefix(&format!("{name}="))).unwrap_or_default();
    let (a, b) = field.split_once("->").unwrap_or_default();
    (a.parse().unwrap_or(usize::MAX), b.parse().unwrap_or(usize::MAX))
}

#[test]
fn thousands_of_unique_ids_keep_descriptors_and_threads_flat() {
    for (ranks, cycles) in [("1", "2000"), ("2", "500")] {
        let out = reinit(&["cycles", ranks, cycles]);
        assert_eq!(out.code, Some(0), "{}", out.describe());
        let line = out.stdout.lines().find(|l| l.starts_with("CYCLES")).unwrap_or_default();
        eprintln!("{line}");
        let (fds, threads) = (before_after(line, "fds"), before_after(line, "threads"));
        // Flat: what one communicator's set-up leaves still running may be counted once.
        assert!(fds.1 <= fds.0 + 3, "descriptors grew over {cycles} cycles of {ranks} rank(s): {line}");
        assert!(threads.1 <= threads.0 + 2, "threads grew over {cycles} cycles of {ranks} rank(s): {line}");
    }
}

#[test]
fn a_unique_id_used_again_fails_at_once() {
    let out = reinit(&["reuse"]);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    let line = |start: &str| {
        out.stdout.lines().find(|l| l.starts_with(start)).unwrap_or_else(|| panic!("no {start}: {}", out.describe()))
    };
    let ms = |l: &str| -> u64 {
        l.split_whitespace().find_map(|w| w.strip_prefix("ms=")).and_then(|v| v.parse().ok()).unwrap_or(u64::MAX)
    };
    // In the process that made it: HCCN_ERROR_INVALID_ARGUMENT at once, saying why.
    for start in ["AGAIN_AFTER_DESTROY rank=0", "AGAIN_AFTER_DESTROY rank=1"] {
        let l = line(start);
        assert!(l.contains("code=1 ") && l.contains("used up") && ms(l) < 1000, "{l}");
    }
    let l = line("AGAIN_WHILE_ALIVE rank=0");
    assert!(l.contains("code=1 ") && l.contains("made its communicator already") && ms(l) < 1000, "{l}");
    // In another process: the store is gone, HCCN_ERROR_STORE within its short patience.
    assert!(line("OTHER_PROCESS ").contains("first_use=Ok(true) child_ok=true"), "{}", out.describe());
    let l = line("CHILD_INIT");
    assert!(l.contains("code=105 ") && l.contains("a unique id makes one communicator") && ms(l) < 3000, "{l}");
    assert!(line("OTHER_PROCESS_AGAIN").contains("child_ok=false"), "{}", out.describe());
}
