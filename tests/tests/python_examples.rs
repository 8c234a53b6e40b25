//! examples/pytorch, run as the README says: each trains on the hccn backend beside a
//! single-process reference and exits non-zero unless they match (the examples assert it).

use std::time::Duration;

use hccn_tests::torch;

const TIMEOUT: Duration = Duration::from_secs(300);

fn run_example(file: &str, n: u32, hccnrun_args: &[&str], env: &[(&str, &str)]) -> hccn_tests::launch::Outcome {
    let path = torch::root().join("examples/pytorch").join(file);
    let mut cmd = std::process::Command::new(hccn_tests::launch::bin("hccnrun"));
    cmd.args(hccnrun_args).arg("-n").arg(n.to_string()).arg("--").arg(torch::python()).arg(path);
    cmd.envs(env.iter().copied());
    torch::use_source_tree(&mut cmd);
    let out = hccn_tests::launch::run(cmd, TIMEOUT);
    assert_eq!(out.code, Some(0), "{file} on {n} ranks failed: {}", out.describe());
    let name = file.trim_end_matches(".py");
    assert!(out.stdout.contains(&format!("{name}: MATCH")), "{file} did not report a match: {}", out.describe());
    out
}

fn run_plain(file: &str, n: u32) {
    let out = run_example(file, n, &[], &[]);
    assert!(out.stdout.contains("step 1"), "{file} printed no per-step log: {}", out.describe());
    // A healthy run is quiet: no warning of the library, no peer failed or slow link (the
    // examples leave torch to end the group at exit, as most scripts do).
    let signs = [" WARN ", "peer failed", "slow link"];
    let warned: Vec<&str> =
        out.stdout.lines().chain(out.stderr.lines()).filter(|l| signs.iter().any(|s| l.contains(s))).collect();
    assert!(warned.is_empty(), "{file} warned in a healthy run: {warned:#?}\n{}", out.describe());
}

#[test]
fn ddp_cnn_matches_a_single_process_run() {
    run_plain("ddp_cnn.py", 2);
}

#[test]
fn zero_stages_1_and_2_match_single_process_adam() {
    run_plain("zero.py", 2);
}

#[test]
fn tensor_parallel_mlp_matches_the_unsplit_block() {
    run_plain("tensor_parallel.py", 2);
}

#[test]
fn pipeline_1f1b_over_4_stages_matches_the_unsplit_model() {
    run_plain("pipeline.py", 4);
}

#[test]
fn data_times_tensor_parallel_on_4_ranks_matches_a_single_process_run() {
    run_plain("two_d.py", 4);
}

/// Launched rank 0 (the host of torch's store) is killed with SIGKILL at step 12: the survivors
/// shrink and go on, the replacement joins later with the state it receives over hccn, and the
/// model ends within 1e-5 of the uninterrupted run.
#[test]
fn elastic_ddp_survives_kill_9_of_rank_0_and_matches_an_uninterrupted_run() {
    let out = run_example("elastic_ddp.py", 3, &["--elastic", "--max-restarts", "1"], &[("ELASTIC_KILL", "0:12")]);
    let said = |needle: &str| out.stdout.contains(needle);
    assert!(said("rank 0: killing itself at step 12"), "{}", out.describe());
    assert!(said("first good step after the failure (step 12)"), "{}", out.describe());
    assert!(said("3 ranks after admitting a replacement"), "{}", out.describe());
    assert!(said("done (replacement: True)"), "the replacement did not finish: {}", out.describe());
}
