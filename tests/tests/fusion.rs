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

/// Buckets 16 times larger and 64 KiB chunks: fused buffers go by descriptor, and peers read
/// them in place from the buckets' shareable staging memory (which they must have mapped).
#[test]
fn fused_buffers_are_read_in_place_by_same_host_peers() {
    let worker = PathBuf::from(env!("CARGO_BIN_EXE_hccn-fusion"));
    let env = [("HCCN_CHUNK_BYTES", "65536"), ("HCCN_LOG", "hccn_runtime::mem=info")];
    let out = launch::hccnrun(3, &worker, &["--scale", "16"], &env, std::time::Duration::from_secs(600));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(!out.stdout.contains("FAIL"), "{}", out.describe());
    for r in 0..3 {
        assert!(out.stdout.contains(&format!("[{r}] rank {r} of 3: ")), "{}", out.describe());
    }
    let all = format!("{}{}", out.stdout, out.stderr);
    assert!(all.contains("mapped a peer's shareable memory"), "no peer mapped a bucket: {}", out.describe());
}
