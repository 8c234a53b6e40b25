//! MindSpore, for real: bindings/mindspore/build.sh builds the AOT shim (functions with the
//! ops.Custom(func_type="aot") signature that call hccn on host buffers); then 2 ranks under
//! hccnrun run, in the mindspore CPU wheel of /opt/hccn/venvs/mindspore (PyNative mode),
//! - bindings/mindspore/tests/collectives.py: the AllReduce/AllGather/Broadcast cells over
//!   their dtypes and ops, gradients and errors, each value checked exactly;
//! - bindings/mindspore/tests/train_step.py: SGD steps with gradients averaged through hccn,
//!   equal across ranks bit for bit and within 1e-5 of the single-process run.
//!
//! Needs the release build and the venv (`bash scripts/setup-frameworks.sh mindspore`, which
//! scripts/test.sh runs).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use hccn_tests::launch::{self, Outcome};

const PYTHON: &str = "/opt/hccn/venvs/mindspore/bin/python";
const BUILD_TIMEOUT: Duration = Duration::from_secs(300);
/// MindSpore's import alone takes seconds per rank on a loaded 2-core machine.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);

fn root() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    root.canonicalize().unwrap_or(root)
}

/// Builds the shim once for both tests; returns the directory to put on PYTHONPATH.
fn built() -> &'static Path {
    static OUT: OnceLock<PathBuf> = OnceLock::new();
    OUT.get_or_init(|| {
        assert!(
            Path::new(PYTHON).exists(),
            "{PYTHON} is missing: run `bash scripts/setup-frameworks.sh mindspore` (scripts/test.sh does)"
        );
        // Under target/<profile>/, rebuilt on every run: nothing is left in the temp dir.
        let out = launch::bin_dir().join("bindings-mindspore");
        let mut cmd = Command::new("bash");
        cmd.arg(root().join("bindings/mindspore/build.sh")).arg("--lib").arg(launch::bin_dir()).arg("--out").arg(&out);
        let build = launch::run(cmd, BUILD_TIMEOUT);
        assert_eq!(build.code, Some(0), "bindings/mindspore/build.sh failed: {}", build.describe());
        out
    })
}

fn run_two_ranks(script: &str) -> Outcome {
    let mut cmd = Command::new(launch::bin("hccnrun"));
    cmd.args(["-n", "2", "--", PYTHON])
        .arg(root().join("bindings/mindspore/tests").join(script))
        .env("PYTHONPATH", built())
        // A framework's import and first trace can keep one rank seconds behind the other on a
        // loaded machine: give each wait more room than the default 30 s (the run's own hard
        // timeout still applies).
        .env("HCCN_TIMEOUT_MS", "120000")
        // The shim finds libhccn.so through its rpath, as a user's would.
        .env_remove("LD_LIBRARY_PATH");
    launch::run(cmd, RUN_TIMEOUT)
}

#[test]
fn mindspore_cells_give_exact_results_on_two_ranks() {
    let out = run_two_ranks("collectives.py");
    assert_eq!(out.code, Some(0), "collectives.py: {}", out.describe());
    for r in 0..2 {
        let line = out.stdout.lines().find(|l| l.contains(&format!("[mindspore] rank {r} of 2: ")));
        assert!(
            line.is_some_and(|l| l.ends_with("checks ok")),
            "rank {r} did not report its checks ok: {}",
            out.describe()
        );
    }
    assert!(!out.stdout.contains("FAIL"), "{}", out.describe());
}

#[test]
fn mindspore_training_step_with_hccn_gradients_matches_one_process() {
    let out = run_two_ranks("train_step.py");
    assert_eq!(out.code, Some(0), "train_step.py: {}", out.describe());
    for r in 0..2 {
        let line = out.stdout.lines().find(|l| l.contains(&format!("[mindspore-train] rank {r} of 2: ")));
        assert!(line.is_some_and(|l| l.ends_with("ok")), "rank {r} did not match: {}", out.describe());
    }
    assert!(out.stdout.contains("step 7: loss"), "no per-step log: {}", out.describe());
    assert!(!out.stdout.contains("FAIL"), "{}", out.describe());
    let log: Vec<&str> = out.stdout.lines().filter(|l| l.contains("step") || l.contains("[mindspore-train]")).collect();
    eprintln!("{}", log.join("\n"));
}
