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
