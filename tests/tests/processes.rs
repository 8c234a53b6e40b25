//! The full matrix in real OS processes over real sockets, through the C ABI, for world sizes
//! 1 to 8 (more ranks than cores, so every wait must yield).

use std::path::PathBuf;
use std::time::Duration;

use hccn_tests::launch;

fn matrix(n: u32) {
    let prog = PathBuf::from(env!("CARGO_BIN_EXE_hccn-matrix"));
    let out = launch::hccnrun(n, &prog, &[], &[("HCCN_CHUNK_BYTES", "4096")], Duration::from_secs(600));
    assert_eq!(out.code, Some(0), "matrix with {n} ranks failed: {}", out.describe());
    for r in 0..n {
        assert!(
            out.stdout.contains(&format!("[{r}] rank {r} of {n}: ")),
            "rank {r} did not report: {}",
            out.describe()
        );
    }
    assert!(!out.stdout.contains("FAIL"), "{}", out.describe());
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
