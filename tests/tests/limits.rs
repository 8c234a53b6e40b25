//! hccn-limits, the floors benches/compare.sh prints beside its table, runs to the end and reports
//! each floor as a number (never a timing assertion: the figures are the machine's).

use std::time::Duration;

use hccn_tests::launch;

/// The number just before `unit` in `line`.
fn figure(line: &str, unit: &str) -> f64 {
    let before = line.split(unit).next().unwrap_or_default();
    let word = before.split_whitespace().last().unwrap_or_default();
    word.parse().unwrap_or_else(|_| panic!("no figure before {unit:?} in {line:?}"))
}

#[test]
fn every_floor_is_measured() {
    let mut cmd = std::process::Command::new(launch::bin("hccn-limits"));
    cmd.arg("--quick");
    let out = launch::run(cmd, Duration::from_secs(120));
    assert_eq!(out.code, Some(0), "hccn-limits failed: {}", out.describe());
    let line = |start: &str| {
        out.stdout
            .lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no {start:?} line: {}", out.describe()))
    };
    let read = line("cross-process read 16 MiB, 2 processes at once:");
    let (cma, memcpy) = (figure(read, "GB/s each ("), figure(read, "GB/s each)"));
    assert!(cma > 0.0 && cma.is_finite() && memcpy > 0.0 && memcpy.is_finite(), "{read}");
    let heap = line("allreduce 16 MiB of heap buffers, 2 processes,");
    let busbw = figure(heap, "GB/s busbw");
    assert!(busbw > 0.0 && busbw.is_finite(), "{heap}");
    for n in [2, 4] {
        let round = line(&format!("post and wait, {n} processes ("));
        let us = figure(round, "us per round");
        assert!(us > 0.0 && us.is_finite(), "{round}");
    }
    assert!(!out.stdout.contains("failed"), "{}", out.describe());
}
