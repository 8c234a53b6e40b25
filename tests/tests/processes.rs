//! The full matrix in real OS processes over real sockets, through the C ABI, for world sizes
//! 1 to 8 (more ranks than cores, so every wait must yield).

use std::path::PathBuf;

use hccn_tests::launch;

fn matrix(n: u32) {
    launch::expect_clean_run(n, &PathBuf::from(env!("CARGO_BIN_EXE_hccn-matrix")), "the matrix");
}

#[test]
fn matrix_1_2_3_ranks() {
    for n in 1..=3 {
        matrix(n);
    }
}

#[test]
fn matrix_4_5_ranks() {
    for n in 4..=5 {
        matrix(n);
    }
}

#[test]
fn matrix_6_7_8_ranks() {
    for n in 6..=8 {
        matrix(n);
    }
}

/// HCCN_ALGO through the C ABI: Rabenseifner with a fold (3, 5 ranks) and without (4), and the
/// tree, over the quick matrix (fp32, int8, bf16).
#[test]
fn matrix_with_forced_algorithms() {
    let m = PathBuf::from(env!("CARGO_BIN_EXE_hccn-matrix"));
    for (algo, n) in [("rhd", 3), ("rhd", 4), ("rhd", 5), ("tree", 3), ("ring", 4)] {
        launch::expect_clean_run_with(n, &m, &["--quick"], &[("HCCN_ALGO", algo)], &format!("the matrix with {algo}"));
    }
}

/// Connections on demand (`HCCN_FULL_MESH_UP_TO=0`, one watched neighbour each side): a world
/// of 5 or 8 ranks forms with the ring neighbours and hypercube partners only, and every other
/// pair connects on its first message — from both sides at once in alltoall's pairwise steps
/// (the lower rank's connection wins on both). The whole matrix, over TCP.
#[test]
fn matrix_with_connections_on_demand() {
    let m = PathBuf::from(env!("CARGO_BIN_EXE_hccn-matrix"));
    // Over shared memory too: a pair on one host sets up its segment when it first links.
    for (transport, n) in [("tcp", 5), ("tcp", 8), ("shm", 6)] {
        let env = [
            ("HCCN_FULL_MESH_UP_TO", "0"),
            ("HCCN_WATCHED_PEERS", "1"),
            ("HCCN_TRANSPORT", transport),
            ("HCCN_CHUNK_BYTES", "4096"),
            ("HCCN_LOG", "warn,hccn_runtime::transport::ondemand=debug,hccn_runtime::transport=info"),
        ];
        let out = launch::hccnrun(n, &m, &[], &env, std::time::Duration::from_secs(600));
        let what = format!("the matrix on {n} ranks connected on demand over {transport}");
        assert_eq!(out.code, Some(0), "{what} failed: {}", out.describe());
        for r in 0..n {
            assert!(out.stdout.contains(&format!("[{r}] rank {r} of {n}: ")), "rank {r}: {}", out.describe());
        }
        assert!(!out.stdout.contains("FAIL"), "{}", out.describe());
        // The pairs the world did not form with did connect, on demand, over `transport`.
        let all = format!("{}{}", out.stdout, out.stderr);
        assert!(all.contains("connected on demand"), "{what}: none did: {}", out.describe());
        let on_demand = all.lines().filter(|l| l.contains("data link on demand"));
        let mut on_demand = on_demand.map(|l| l.contains(&format!("transport=\"{transport}\"")));
        assert!(on_demand.all(|right| right), "{what}: a link on demand over another transport: {}", out.describe());
        assert!(!all.contains("peer failed"), "{}", out.describe());
    }
}
