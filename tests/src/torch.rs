//! The torch backend in tests: its C++ extension built once per test binary into
//! `target/torch-ext` (bindings/python/build_torch_ext.py, which skips the compiler when neither
//! its sources nor torch changed), and processes that use the source tree's `hccn` package, that
//! extension and this build's libhccn.so, in the pinned venv of scripts/setup-python.sh.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::launch::{self, Outcome};

/// The torch venv's interpreter.
pub const PYTHON: &str = "/opt/hccn/venvs/torch/bin/python";

/// A cold build of the extension takes 1.5 to 3 minutes on the loaded 2-core machine.
const BUILD_TIMEOUT: Duration = Duration::from_secs(20 * 60);

pub fn root() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    root.canonicalize().unwrap_or(root)
}

pub fn python() -> &'static Path {
    let p = Path::new(PYTHON);
    assert!(p.exists(), "{PYTHON} is missing: run `bash scripts/setup-python.sh torch` (scripts/test.sh does)");
    p
}

/// Builds the extension into target/torch-ext unless it is up to date (once per test binary).
pub fn extension() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let mut cmd = Command::new(python());
        cmd.arg(root().join("bindings/python/build_torch_ext.py"));
        cmd.arg("--out").arg(root().join("target/torch-ext"));
        let out = launch::run(cmd, BUILD_TIMEOUT);
        assert_eq!(out.code, Some(0), "building hccn._torch_C failed: {}", out.describe());
        // "built in N s" or "up to date": the test log says which.
        eprintln!("{}", out.stdout.trim());
    });
}

/// Makes `cmd` use the source tree's package, the extension built above, and this build's
/// library.
pub fn use_source_tree(cmd: &mut Command) -> &mut Command {
    extension();
    cmd.env("PYTHONPATH", root().join("bindings/python"))
        .env("HCCN_LIB", launch::bin_dir().join("libhccn.so"))
        // Importing torch takes seconds per rank on a loaded machine, so ranks reach their first
        // operation (or a replacement its admission) far apart: more room than the default 30 s.
        .env("HCCN_TIMEOUT_MS", "120000")
        // Torch's own warnings of deprecated APIs that the tests call on purpose.
        .env("PYTHONWARNINGS", "ignore::FutureWarning")
}

/// `hccnrun [hccnrun_args] -n N -- python script args` with the source tree's package.
pub fn hccnrun(n: u32, hccnrun_args: &[&str], script: &Path, args: &[&str], timeout: Duration) -> Outcome {
    let mut cmd = Command::new(launch::bin("hccnrun"));
    cmd.args(hccnrun_args).arg("-n").arg(n.to_string()).arg("--").arg(python()).arg(script).args(args);
    use_source_tree(&mut cmd);
    launch::run(cmd, timeout)
}

/// `python -m torch.distributed.run --standalone --nproc-per-node N script args` (torchrun).
pub fn torchrun(n: u32, script: &Path, args: &[&str], timeout: Duration) -> Outcome {
    let mut cmd = Command::new(python());
    cmd.args(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node"])
        .arg(n.to_string())
        .arg(script)
        .args(args);
    use_source_tree(&mut cmd);
    launch::run(cmd, timeout)
}

/// Asserts exit 0 and a "rank r of n: ok" line from every rank.
pub fn expect_ok(out: &Outcome, n: u32, what: &str) {
    assert_eq!(out.code, Some(0), "{what} failed: {}", out.describe());
    for r in 0..n {
        assert!(
            out.stdout.contains(&format!("rank {r} of {n}: ok")),
            "{what}: rank {r} did not report: {}",
            out.describe()
        );
    }
}
