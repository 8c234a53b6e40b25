//! Compressed allreduce in real processes through the C ABI, 1 to 5 ranks, with 4 KiB chunks so
//! that the larger counts cross many pipeline chunks (the worker is src/bin/hccn-compressed.rs).

use std::path::PathBuf;
use std::time::Duration;

use hccn_tests::launch;

fn compressed(n: u32) {
    let prog = PathBuf::from(env!("CARGO_BIN_EXE_hccn-compressed"));
    let out = launch::hccnrun(n, &prog, &[], &[("HCCN_CHUNK_BYTES", "4096")], Duration::from_secs(300));
    assert_eq!(out.code, Some(0), "compressed allreduce with {n} ranks failed: {}", out.describe());
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
