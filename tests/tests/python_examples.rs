//! examples/pytorch, run as the README says: each trains on the hccn backend beside a
//! single-process reference and exits non-zero unless they match (the examples assert it).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use hccn_tests::launch;

fn run_example(file: &str, n: u32) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = PathBuf::from("/opt/hccn/venvs/torch/bin/python");
    assert!(python.exists(), "{} is missing: run `bash scripts/setup-python.sh torch`", python.display());
    let lib = launch::bin_dir().join("libhccn.so");
    let mut cmd = Command::new(launch::bin("hccnrun"));
    cmd.arg("-n").arg(n.to_string()).arg("--").arg(python).arg(root.join("examples/pytorch").join(file));
    cmd.env("HCCN_LIB", lib);
    let out = launch::run(cmd, Duration::from_secs(300));
    assert_eq!(out.code, Some(0), "{file} on {n} ranks failed: {}", out.describe());
    let name = file.trim_end_matches(".py");
    assert!(out.stdout.contains(&format!("{name}: MATCH")), "{file} did not report a match: {}", out.describe());
    assert!(out.stdout.contains("step 1"), "{file} printed no per-step log: {}", out.describe());
}

#[test]
fn ddp_cnn_matches_a_single_process_run() {
    run_example("ddp_cnn.py", 2);
}

#[test]
fn zero_stages_1_and_2_match_single_process_adam() {
    run_example("zero.py", 2);
}

#[test]
fn tensor_parallel_mlp_matches_the_unsplit_block() {
    run_example("tensor_parallel.py", 2);
}

#[test]
fn pipeline_1f1b_over_4_stages_matches_the_unsplit_model() {
    run_example("pipeline.py", 4);
}

#[test]
fn data_times_tensor_parallel_on_4_ranks_matches_a_single_process_run() {
    run_example("two_d.py", 4);
}
