//! Compressed allreduce in real processes through the C ABI, 1 to 5 ranks, with 4 KiB chunks so
//! that the larger counts cross many pipeline chunks (the worker is src/bin/hccn-compressed.rs).

use std::path::PathBuf;

use hccn_tests::launch;

fn compressed(n: u32) {
    launch::expect_clean_run(n, &PathBuf::from(env!("CARGO_BIN_EXE_hccn-compressed")), "compressed allreduce");
}

#[test]
fn compressed_1_2_3_ranks() {
    for n in 1..=3 {
        compressed(n);
    }
}

#[test]
fn compressed_4_5_ranks() {
    for n in 4..=5 {
        compressed(n);
    }
}
