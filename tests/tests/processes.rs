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
