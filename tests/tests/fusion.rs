//! Fusion buckets in real processes through the C ABI, 3 and 4 ranks (the worker is
//! src/bin/hccn-fusion.rs): FP32 SUM and INT32 MAX, with and without a stream, against exact
//! results and unfused allreduces; 4 KiB chunks so that fused buffers cross many chunks.

use std::path::PathBuf;
use std::time::Duration;

use hccn_tests::launch;

fn fusion(n: u32) {
    let prog = PathBuf::from(env!("CARGO_BIN_EXE_hccn-fusion"));
    let out = launch::hccnrun(n, &prog, &[], &[("HCCN_CHUNK_BYTES", "4096")], Duration::from_secs(300));
    assert_eq!(out.code, Some(0), "fusion with {n} ranks failed: {}", out.describe());
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
fn fusion_3_ranks() {
    fusion(3);
}

#[test]
fn fusion_4_ranks() {
    fusion(4);
}
