//! The Python package (bindings/python), run in the real interpreter with real torch from
//! /opt/hccn/venvs/torch (made by scripts/setup-python.sh), as real processes under hccnrun,
//! each run with a hard timeout. Its torch.distributed backend: python_torch.rs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use hccn_tests::launch::{self, Outcome};

const TIMEOUT: Duration = Duration::from_secs(240);

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn script(name: &str) -> PathBuf {
    root().join("bindings/python/tests").join(name)
}

/// The torch virtualenv's interpreter.
fn python() -> PathBuf {
    let p = PathBuf::from("/opt/hccn/venvs/torch/bin/python");
    assert!(p.exists(), "{} is missing: run `bash scripts/setup-python.sh torch`", p.display());
    p
}

/// This build's library, so that a package installed before the last `cargo build` cannot hide
/// a change (the package's own copy is checked by `the_package_finds_its_library`).
fn lib() -> String {
    launch::bin_dir().join("libhccn.so").display().to_string()
}

fn hccnrun(n: u32, args: &[&Path]) -> Outcome {
    let mut cmd = Command::new(launch::bin("hccnrun"));
    cmd.arg("-n").arg(n.to_string()).arg("--").arg(python()).args(args).env("HCCN_LIB", lib());
    launch::run(cmd, TIMEOUT)
}

fn expect_ok(out: &Outcome, n: u32, what: &str) {
    assert_eq!(out.code, Some(0), "{what} failed: {}", out.describe());
    for r in 0..n {
        assert!(
            out.stdout.contains(&format!("rank {r} of {n}: ok")),
            "{what}: rank {r} did not report: {}",
            out.describe()
        );
    }
}

#[test]
fn python_package_collectives_on_numpy_and_torch() {
    // Three ranks: an odd size, a sub-group that leaves a rank out, uneven halves of a split.
    let out = hccnrun(3, &[&script("collectives.py")]);
    expect_ok(&out, 3, "collectives.py");
    assert!(out.stdout.contains(&format!("(library {};", lib())), "HCCN_LIB was not used: {}", out.describe());
    assert!(!out.stdout.contains("numpy only"), "the torch checks were skipped: {}", out.describe());
}

#[test]
fn the_package_finds_its_library_next_to_itself_or_through_hccn_lib() {
    let probe = "import hccn, os; print('LIB', hccn._raw.library_path, hccn.version())";
    let mut cmd = Command::new(python());
    cmd.args(["-c", probe]).env_remove("HCCN_LIB");
    let own = launch::run(cmd, TIMEOUT);
    assert_eq!(own.code, Some(0), "{}", own.describe());
    assert!(own.stdout.contains("/site-packages/hccn/lib/libhccn.so.1 ("), "{}", own.describe());

    let mut cmd = Command::new(python());
    cmd.args(["-c", probe]).env("HCCN_LIB", "/nonexistent/libhccn.so");
    let missing = launch::run(cmd, TIMEOUT);
    assert_ne!(missing.code, Some(0), "{}", missing.describe());
    assert!(
        missing.stderr.contains("ImportError") && missing.stderr.contains("/nonexistent/libhccn.so (missing)"),
        "{}",
        missing.describe()
    );
}

#[test]
fn python_init_through_a_file_store_and_a_torch_tcp_store() {
    let dir = std::env::temp_dir().join(format!("hccn-py-store-{}", std::process::id()));
    let mut cmd = Command::new(python());
    cmd.arg(script("init_store.py")).arg("3").arg(&dir).env("HCCN_LIB", lib());
    let out = launch::run(cmd, TIMEOUT);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.code, Some(0), "{}", out.describe());
    assert!(!out.stdout.contains("file store only"), "{}", out.describe());
    for kind in ["file", "tcp"] {
        for r in 0..3 {
            assert!(out.stdout.contains(&format!("{kind} rank {r} of 3: ok")), "{}", out.describe());
        }
    }
}
