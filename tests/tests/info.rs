//! hccn-info under hccnrun with 3 ranks on this host: one host row holding every rank, a
//! measured shared-memory row per pair, and the algorithm these ranks would run for every operation.

use std::time::Duration;

use hccn_runtime::collectives::select;
use hccn_tests::launch;

#[test]
fn three_ranks_on_one_host() {
    let out = launch::hccnrun(3, &launch::bin("hccn-info"), &[], &[], Duration::from_secs(120));
    assert_eq!(out.code, Some(0), "hccn-info failed: {}", out.describe());
    let lines: Vec<&str> = out.stdout.lines().filter_map(|l| l.strip_prefix("[0] ")).collect();
    assert!(!out.stdout.lines().any(|l| l.starts_with("[1] ") || l.starts_with("[2] ")), "{}", out.stdout);
    let row = |first: &str| -> Vec<&str> {
        let cols = lines.iter().map(|l| l.split_whitespace().collect::<Vec<_>>()).find(|c| c.first() == Some(&first));
        cols.unwrap_or_else(|| panic!("no row {first:?}: {}", out.stdout))
    };
    assert!(lines[0].contains("3 ranks on 1 host(s)"), "{}", out.stdout);
    let host = lines[2].split_whitespace().collect::<Vec<_>>();
    assert_eq!(host[1..], ["3", "0,1,2"], "{}", out.stdout);
    for (i, j) in [(0, 1), (0, 2), (1, 2)] {
        let link = lines.iter().find(|l| l.starts_with(&format!("{i} <-> {j} "))).expect("a row per pair");
        let cols: Vec<&str> = link.split_whitespace().collect();
        assert_eq!(cols[3], "shm", "ranks on one host share memory: {link}");
        let lat: f64 = cols[4].parse().expect("latency");
        let bw: f64 = cols[5].parse().expect("bandwidth");
        assert!(lat > 0.0 && lat < 1e6 && bw > 0.0, "{link}");
    }
    // What these ranks would run: the board for every small collective of this one-host
    // communicator, the cost model's message algorithms past HCCN_BOARD_BYTES.
    let known = ["board", "rd", "rhd", "ring", "ring_compressed", "tree", "linear", "pairwise", "dissemination"];
    for op in select::OPS {
        let cols = row(op);
        assert_eq!(cols.len(), 7, "{op}: {cols:?}");
        assert!(cols[1..].iter().all(|a| known.contains(a)), "{op}: {cols:?}");
        let small = if *op == "allreduce_compressed" { "ring_compressed" } else { "board" };
        assert_eq!(cols[1], small, "{op} at 8 bytes: {cols:?}");
        if *op != "barrier" {
            assert_ne!(cols[6], "board", "{op} at 256 MiB: {cols:?}");
        }
    }
}
