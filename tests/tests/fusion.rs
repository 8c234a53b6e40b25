//! Fusion buckets in real processes through the C ABI, 3 and 4 ranks (the worker is
//! src/bin/hccn-fusion.rs): FP32 SUM and INT32 MAX, with and without a stream, against exact
//! results and unfused allreduces; 4 KiB chunks so that fused buffers cross many chunks.

use std::path::PathBuf;

use hccn_tests::launch;

fn fusion(n: u32) {
    launch::expect_clean_run(n, &PathBuf::from(env!("CARGO_BIN_EXE_hccn-fusion")), "fusion");
}

#[test]
fn fusion_3_ranks() {
    fusion(3);
}

#[test]
fn fusion_4_ranks() {
    fusion(4);
}
