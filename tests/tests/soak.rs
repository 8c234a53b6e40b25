//! The soak at a reduced count: random collectives on 4 ranks (tests/src/bin/hccn-soak.rs), every
//! result exact, open descriptors flat and resident memory flat within a margin. The full
//! 10,000-operation run is `bash benches/soak.sh`.

use std::path::PathBuf;
use std::time::Duration;

use hccn_tests::launch;

const OPS: &str = "1200";
/// Resident memory of the second half may exceed the first half's by this much: buffers of up to
/// 4 MiB per operation, the allocator's arenas per thread, and the largest operation seen so far
/// make RSS noisy; a leak of the soak's traffic (gigabytes) would not fit.
const RSS_MARGIN_KB: u64 = 16 << 10;

fn field(line: &str, name: &str) -> Option<String> {
    line.split_whitespace().find_map(|w| w.strip_prefix(&format!("{name}="))).map(str::to_owned)
}

fn num(line: &str, name: &str) -> u64 {
    field(line, name).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no {name} in {line:?}"))
}

#[test]
fn random_collectives_stay_exact_and_flat() {
    let soak = PathBuf::from(env!("CARGO_BIN_EXE_hccn-soak"));
    let out = launch::hccnrun(4, &soak, &[OPS, "7"], &[], Duration::from_secs(400));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(!out.stdout.contains("FAIL"), "{}", out.describe());
    for r in 0..4 {
        let line = out
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("[{r}] SOAK ")))
            .unwrap_or_else(|| panic!("rank {r} did not report: {}", out.describe()));
        eprintln!("{line}");
        assert_eq!(num(line, "wrong"), 0, "{line}");
        assert!(num(line, "checks") > 100, "{line}");
        let (warm_fds, peak_fds, end_fds) = (num(line, "warm_fds"), num(line, "peak_fds"), num(line, "end_fds"));
        assert!(peak_fds <= warm_fds + 2 && end_fds <= warm_fds, "descriptors grew: {line}");
        let tenths: Vec<u64> =
            field(line, "rss_kb_by_tenth").unwrap_or_default().split(',').filter_map(|v| v.parse().ok()).collect();
        assert!(tenths.len() >= 8, "{line}");
        let (first, second) = tenths.split_at(tenths.len() / 2);
        let (a, b) = (first.iter().max().copied().unwrap_or(0), second.iter().max().copied().unwrap_or(0));
        assert!(b <= a + RSS_MARGIN_KB, "resident memory grew from {a} KiB to {b} KiB: {line}");
    }
}
