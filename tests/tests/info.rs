//! hccn-info under hccnrun with 3 ranks on this host: one host row holding every rank, a
//! measured shared-memory row per pair, the algorithm these ranks would run for every operation,
//! and every rank's resources; and the resources alone of a larger job over TCP.

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
    // Rank 0 measured what a single-copy read costs its host (HCCN_CMA=auto), and says it.
    let reads = lines.iter().find(|l| l.starts_with("# single-copy reads")).expect("the single-copy line");
    assert!(reads.contains(" us against a ") && reads.contains(" us copy: "), "{reads}");
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
    for row in resource_rows(&out.stdout, 3) {
        assert_eq!(row[1], 2.0, "a connection per peer: {row:?}");
        assert!(row[3] > 0.0, "rings and the board are mapped: {row:?}");
    }
}

/// The resource rows rank 0 printed: per rank, its figures in the header's order.
fn resource_rows(stdout: &str, n: usize) -> Vec<Vec<f64>> {
    let lines: Vec<&str> = stdout.lines().filter_map(|l| l.strip_prefix("[0] ")).collect();
    let head = lines.iter().position(|l| l.starts_with("rank ") && l.contains("heartbeats/s"));
    let head = head.unwrap_or_else(|| panic!("no resource table: {stdout}"));
    let rows: Vec<Vec<f64>> = lines[head + 1..]
        .iter()
        .take(n)
        .map(|l| l.split_whitespace().map(|c| c.parse().expect("a number")).collect())
        .collect();
    assert_eq!(rows.len(), n, "a row per rank: {stdout}");
    for (r, row) in rows.iter().enumerate() {
        assert_eq!(row.len(), 6, "rank {r}: {row:?}");
        assert_eq!(row[0], r as f64, "rows in rank order: {stdout}");
    }
    rows
}

#[test]
fn resources_of_every_rank_with_heartbeats_to_its_watched_peers_only() {
    // 12 ranks over TCP: each watches 3 on each side (HCCN_WATCHED_PEERS), so heartbeats per
    // second do not depend on the job's size; every rank still holds a connection per peer.
    let env = [("HCCN_TRANSPORT", "tcp")];
    let out = launch::hccnrun(12, &launch::bin("hccn-info"), &["--resources"], &env, Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "hccn-info --resources failed: {}", out.describe());
    assert!(!out.stdout.contains(" <-> "), "--resources measures no link: {}", out.stdout);
    for row in resource_rows(&out.stdout, 12) {
        let (connections, threads, shm, beats) = (row[1], row[2], row[3], row[5]);
        assert_eq!(connections, 11.0, "{row:?}");
        assert!((1.0..=8.0).contains(&threads), "{row:?}");
        assert_eq!(shm, 0.0, "no shared memory over TCP: {row:?}");
        // 6 watched peers, a heartbeat and a pulse each per HCCN_HEARTBEAT_MS (100 ms): 120 a
        // second; a loaded machine delays some beats, none is sent to an unwatched peer.
        assert!(beats > 0.0 && beats <= 6.0 * 2.0 * 10.0 * 1.5, "{row:?}");
    }
}
